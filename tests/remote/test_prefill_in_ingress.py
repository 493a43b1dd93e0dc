"""The ingress's own prefill calls to remote engines (no Prefill deployment), without
Ray: against emulator threads, bad input and a down engine give the same errors the
Prefill deployment gave (over-context 400, the engine's 400 passed on, 503 for an
engine down), and a good prompt gives an unheld ticket that the ingress's lease hands
to the keeper off the path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from br_serve.emulator.server import EmulatorThread
from br_serve.engine.base import SamplingParams
from br_serve.serve.config import parse_graph_config
from br_serve.serve.frontend.events import GenerateError
from br_serve.serve.frontend.prefilling import Prefill
from br_serve.serve.prefill.remote import RemotePrefiller
from br_serve.transport.lease import KVLease
from tests.emulator.helpers import config, servers


class _Keeper:
    def __init__(self) -> None:
        self.held: list[str] = []
        outer = self

        class _M:
            def remote(self, handles: list[Any]) -> Any:
                outer.held += [h.key for h in handles]
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(None)
                return fut
        self.hold_many = _M()


def _prefill(protocol: str, url: str, **kw: Any) -> Prefill:
    cfg = parse_graph_config(engine=protocol, remote_prefill_urls=url,
                             remote_decode_urls="http://127.0.0.1:9", remote_model="emulated",
                             **kw)
    return Prefill(RemotePrefiller(cfg))


async def _call(p: Prefill, rid: str, prompt: str, max_tokens: int,
                lease: KVLease) -> Any:
    try:
        return await p(rid, prompt, SamplingParams(max_tokens=max_tokens, seed=1), lease)
    except GenerateError as exc:
        return exc


def test_vllm_ticket_held_off_path_engine_400_passed_on_and_503_when_down() -> None:
    keeper = _Keeper()
    lease = KVLease(None, keeper=keeper)
    pre = EmulatorThread(config("vllm", "prefill", 1, kv_limit_tokens=64))
    pre.start()
    try:
        p = _prefill("vllm", pre.url)
        assert p.in_process

        async def run() -> list[Any]:
            ok = await _call(p, "ok", "a b c", 4, lease)
            bad = await _call(p, "long", " ".join(["w"] * 100), 4, lease)
            await asyncio.sleep(0.01)
            await asyncio.to_thread(pre.stop)  # the engine goes away: a 503
            return [ok, bad, await _call(p, "down", "a b", 4, lease)]

        ok, bad, down = asyncio.run(run())
    except BaseException:
        pre.stop()
        raise
    assert ok.kv is not None and ok.kv.ref.protocol == "vllm" and ok.first_token_pending
    assert keeper.held == ["ok"]
    assert isinstance(bad, GenerateError) and bad.status == 400, bad
    assert "maximum context length" in bad.message
    assert isinstance(down, GenerateError) and down.status == 503, down
    assert down.type == "service_unavailable"


def test_sglang_over_context_is_the_graphs_400_before_any_engine_call() -> None:
    keeper = _Keeper()
    lease = KVLease(None, keeper=keeper)
    with servers(config("sglang", "prefill", 1)) as (pre,):
        p = _prefill("sglang", pre.url, serve_max_context_tokens=16)
        exc = asyncio.run(_call(p, "long", " ".join(["w"] * 10), 12, lease))
    assert isinstance(exc, GenerateError) and exc.status == 400, exc
    assert exc.message.startswith("prompt: this model's maximum context length is 16")
    assert keeper.held == []


def test_an_unreachable_prefill_url_fails_the_ingress_naming_it() -> None:
    from tests.serve.helpers import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=r"remote.prefill_urls\[0\] .*cannot reach"):
        _prefill("sglang", closed)
