"""The ingress Streamer against fake actor handles (no Ray): what happens to a KV that no
decode replica will ever pull, and to a pool entry whose client went away.

Why it matters: a Mooncake key stays in the prefill worker's segment until someone
removes it, so every path that abandons a prefilled request must release its handle;
and a pool entry the ingress forgets to drop is resubmitted after a scheduler restart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from br_serve.engine.base import SamplingParams
from br_serve.serve.config import parse_graph_config
from br_serve.serve.messages import Admitted, PrefillOutput
from br_serve.serve.streams import GenerateError, Streamer
from br_serve.transport.base import KVHandle


class _Method:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        self.actor.calls.append((self.name, args))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer = self.actor.answers.get(self.name)
        if isinstance(answer, BaseException):
            fut.set_exception(answer)
        elif callable(answer):
            res = answer(*args)
            if res is not _NEVER:
                fut.set_result(res)
        else:
            fut.set_result(answer)
        return fut


_NEVER = object()


class FakeActor:
    """``handle.method.remote(*args)``: records the call, answers from ``answers``
    (a value, an exception, or a function of the arguments; ``_NEVER`` never answers)."""

    def __init__(self, **answers: Any) -> None:
        self.answers: dict[str, Any] = answers
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_") or name in ("answers", "calls"):
            raise AttributeError(name)
        return _Method(self, name)

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]


def _prefill(transport: str) -> FakeActor:
    def run(rid: str, prompt: Any, params: SamplingParams) -> PrefillOutput:
        return PrefillOutput(rid, prompt_tokens=3, first_token_id=7, first_token_text="a",
                             kv=KVHandle(transport, f"kv-{rid}", 12))
    return FakeActor(prefill=run)


def _decode(events: list[Any] | None = None) -> FakeActor:
    pending = list(events or [])

    def poll(owner: str, timeout_s: float) -> Any:
        if pending:
            out = list(pending)
            pending.clear()
            return out
        return _NEVER

    return FakeActor(poll=poll, abort=None, release_kv=None)


def _world(submit: str, transport: str = "mooncake"
           ) -> tuple[Streamer, FakeActor, list[FakeActor], FakeActor]:
    """A Streamer over two fake decode replicas; the scheduler answers ``submit``.
    Returns (streamer, scheduler, decode replicas, keeper)."""
    keeper = FakeActor(release=None)
    sched = FakeActor(submit=submit, get_incarnation="i", cancel=None)
    dec = [_decode(), _decode()]
    cfg = parse_graph_config(replicas=len(dec), transport="objref")
    return Streamer(cfg, _prefill(transport), sched, dec, keeper), sched, dec, keeper


def _params(n: int = 4) -> SamplingParams:
    return SamplingParams(max_tokens=n, seed=1)


async def _first_then_close(s: Streamer) -> None:
    gen = s.generate("a b c", _params())
    first = await gen.__anext__()
    assert first.index == 0
    await gen.aclose()  # the client went away before any decode replica took it
    await asyncio.sleep(0)


@pytest.mark.parametrize("transport", ["mooncake", "objref"])
def test_full_pool_releases_the_kv_nobody_will_pull(transport: str) -> None:
    async def go() -> None:
        s, _, dec, keeper = _world("full", transport)
        with pytest.raises(GenerateError) as err:
            await s.generate("a b c", _params()).__anext__()
        assert err.value.status == 429
        key = keeper.called("release")
        assert [k for (k,) in key] == [f"kv-{s.owner}-1"]
        released = dec[0].called("release_kv") + dec[1].called("release_kv")
        # a key-holding store needs an explicit remove, through exactly one replica;
        # object refs are freed by the keeper alone
        assert len(released) == (1 if transport == "mooncake" else 0)
        await s.close()

    asyncio.run(go())


def test_client_gone_before_admission_drops_entry_and_kv() -> None:
    async def go() -> None:
        s, sched, dec, keeper = _world("queued")
        await _first_then_close(s)
        rid = f"{s.owner}-1"
        assert s._pending == {} and s._queues == {}
        assert sched.called("cancel") == [(rid,)]  # out of the scheduler's pool too
        assert [k for (k,) in keeper.called("release")] == [f"kv-{rid}"]
        assert len(dec[0].called("release_kv")) == 1
        await s.close()

    asyncio.run(go())


def test_release_skips_dead_replicas() -> None:
    async def go() -> None:
        s, _, dec, _ = _world("full")
        s._dead.add(0)
        with pytest.raises(GenerateError):
            await s.generate("a b c", _params()).__anext__()
        assert dec[0].called("release_kv") == [] and len(dec[1].called("release_kv")) == 1
        await s.close()

    asyncio.run(go())


def test_client_gone_after_admission_aborts_on_its_replica() -> None:
    async def go() -> None:
        s, sched, dec, keeper = _world("queued")
        rid = f"{s.owner}-1"
        dec[1] = _decode([Admitted(rid, 1)])
        s._decode[1] = dec[1]
        gen = s.generate("a b c", _params())
        await gen.__anext__()
        # the client disconnects while waiting for the next token: Starlette cancels
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(gen.__anext__(), 0.3)
        assert dec[1].called("abort") == [(rid,)]  # frees the slot it holds
        assert sched.called("cancel") == []
        assert keeper.called("release") == []  # the replica pulled it and released it
        await s.close()

    asyncio.run(go())
