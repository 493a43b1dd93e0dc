"""Remote-engine configuration (field-named errors), tickets and the keeper's hand-over."""

from __future__ import annotations

import asyncio

import pytest

from br_serve.engine.base import SamplingParams
from br_serve.remote.requests import Bootstrap
from br_serve.remote.ticket import RemoteTicket, completion_body, estimate_prompt_tokens
from br_serve.serve.config import GraphConfigError, parse_graph_config
from br_serve.transport.base import KVHandle
from br_serve.transport.keeper import KVKeeper

P = "http://10.0.0.1:8100"
D = "http://10.0.0.2:8200"


def test_layouts_set_replicas() -> None:
    c = parse_graph_config(engine="vllm", remote_prefill_urls=P, remote_decode_urls=D,
                           remote_dp_size="8")
    assert c.replicas == 8 and c.remote.decode_target(5) == (D, 5)
    assert c.kv_transport() == "remote"
    urls = ",".join(f"http://10.0.0.2:{8200 + g}" for g in range(4))
    c = parse_graph_config(engine="vllm", remote_prefill_urls=P, remote_decode_urls=urls)
    assert c.replicas == 4 and c.remote.decode_target(2) == ("http://10.0.0.2:8202", None)
    c = parse_graph_config(engine="sglang", remote_prefill_urls=P, remote_decode_urls=D,
                           remote_dp_size=2, replicas="2")
    assert c.replicas == 2 and c.keeper_ttl_s() == c.pool.ttl_s
    assert parse_graph_config().kv_transport() == "objref"


V = {"engine": "vllm", "remote.prefill_urls": P}


@pytest.mark.parametrize("args, field", [
    ({"engine": "vllm", "remote.decode_urls": D}, "remote.prefill_urls"),
    ({"engine": "vllm", "remote.prefill_urls": P}, "remote.decode_urls"),
    ({**V, "remote.prefill_urls": "ftp://x:1", "remote.decode_urls": D},
     "remote.prefill_urls"),
    ({**V, "remote.prefill_urls": P + "/v1", "remote.decode_urls": D}, "remote.prefill_urls"),
    ({**V, "remote.decode_urls": f"{D},{D}"}, "remote.decode_urls"),
    ({**V, "remote.decode_urls": f"{D},{P}", "remote.dp_size": 2}, "remote.dp_size"),
    ({"engine": "sglang", "remote.prefill_urls": P, "remote.decode_urls": f"{D},{P}"},
     "remote.decode_urls"),
    ({**V, "remote.decode_urls": D, "remote.dp_size": 4, "replicas": 3}, "replicas"),
    ({"remote.prefill_urls": P}, "remote.prefill_urls"),
    ({**V, "remote.decode_urls": D, "pool.ttl_s": 0}, "pool.ttl_s"),
])
def test_bad_remote_config_names_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(GraphConfigError) as err:
        parse_graph_config(args)
    assert str(err.value).startswith(field), str(err.value)


def test_ticket_calls() -> None:
    body = completion_body("a b", SamplingParams(max_tokens=4, seed=3, stop=("x",)), "m")
    assert body == {"model": "m", "prompt": "a b", "max_tokens": 4, "temperature": 0.0,
                    "top_p": 1.0, "seed": 3, "stop": ["x"]}
    kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e",
          "remote_block_ids": [1], "remote_host": "h", "remote_port": 1}
    t = RemoteTicket("vllm", P, "r1", body, 2, kv_transfer_params=kv)
    b, h = t.decode_call("r1", 3)
    assert b["kv_transfer_params"] == kv and b["stream"] is True
    assert h["X-data-parallel-rank"] == "3" and b["max_tokens"] == 4
    assert t.release_call() == (f"{P}/v1/requests/r1/cancel", None)
    s = RemoteTicket("sglang", P, "r2", body, 2, bootstrap=Bootstrap("10.0.0.1", 8998, 7))
    b, h = s.decode_call("r2", 1)
    assert b["routed_dp_rank"] == 1 and b["bootstrap_room"] == 7 and h == {}
    assert s.release_call() == (f"{P}/abort_request", {"rid": "r2"})
    # a vLLM ticket without parameters is a prompt-keyed connector's: same prompt, none
    q = RemoteTicket("vllm", P, "r", body, 2)
    b, _ = q.decode_call("r", None)
    assert q.prompt_keyed and not t.prompt_keyed and "kv_transfer_params" not in b
    assert b["prompt"] == "a b" and b["stream"] is True
    assert estimate_prompt_tokens([1, 2, 3]) == 3 and estimate_prompt_tokens("a  b\nc") == 3


class _Recorder:
    name = "rec"

    def __init__(self) -> None:
        self.freed: list[str] = []

    def release(self, handle: KVHandle) -> None:
        self.freed.append(handle.key)


def test_keeper_hands_a_consumed_remote_ticket_over_and_frees_the_rest_once() -> None:
    async def go() -> None:
        k = KVKeeper(ttl_s=100.0)
        rec = _Recorder()
        k._transport = rec  # type: ignore[assignment]
        remote = [KVHandle("remote", f"t{i}", 0, None, freed_by_consumer=True)
                  for i in range(3)]
        local = KVHandle("objref", "o", 8, None)
        for h in [*remote, local]:
            await k.hold(h)
        await k.release(remote[0], consumed=True)   # decoded: the engine frees it
        await k.release(remote[1])                  # given up: cancelled on the engine
        await k.release(remote[1])                  # twice: not again
        await k.release(local, consumed=True)       # local transports always free
        assert rec.freed == ["t1", "o"]
        assert await k.counts() == {"held": 1, "freed": 2, "handed_over": 1, "late": 0}
    asyncio.run(go())
