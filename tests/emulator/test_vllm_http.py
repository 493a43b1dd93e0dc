"""The vLLM-protocol emulator over real HTTP, driven by br_serve.remote's client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from br_serve.emulator.server import EmulatorThread
from br_serve.remote.client import RemoteEngineClient, Timeouts
from br_serve.remote.errors import (
    EngineHTTPError,
    EngineUnreachable,
    StreamBroken,
    StreamStalled,
)
from br_serve.remote.loads import single_rank_load
from br_serve.remote.requests import endpoint_path, vllm_decode_request
from br_serve.remote.sse import TokenChunk
from tests.emulator.helpers import config, expected_texts, servers, vllm_pd
from tests.serve.helpers import free_port

G = 4


@pytest.fixture(scope="module")
def pd() -> Iterator[tuple[EmulatorThread, EmulatorThread]]:
    with servers(config("vllm", "prefill"),
                 config("vllm", "decode", G, enable_fault_injection=True)) as (p, d):
        yield p, d


def stats(t: EmulatorThread) -> dict[str, Any]:
    return dict(httpx.get(t.url + "/emulator/stats").json())


def body(prompt: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": "emulated", "prompt": prompt, "max_tokens": max_tokens, **kw}


def test_streamed_tokens_equal_max_tokens_and_match_the_step_model(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            out = await vllm_pd(c, p.url, d.url, body("one two three", 7), "t-exact", 2)
        assert out.texts == expected_texts("one two three", 7)
        assert out.prefill_text == out.texts[0]  # the decode recomputes the same token
        assert out.completion_tokens == 7 and out.done is not None
        assert out.done.usage is not None and out.done.usage.completion_tokens == 7
        assert out.done.finish_reason == "length"
    asyncio.run(go())
    rank2 = stats(d)["ranks"][2]
    assert "t-exact" in rank2["admitted"] and rank2["kv_pulls"] >= 1


@pytest.mark.slow
def test_hundred_concurrent_requests_pinned_and_released_exactly_once(pd: Any) -> None:
    p, d = pd
    n = 100
    before = stats(p)["kv"]

    async def go() -> list[Any]:
        async with RemoteEngineClient() as c:
            return list(await asyncio.gather(*[
                vllm_pd(c, p.url, d.url, body(f"w{i} x y", 3 + i % 5), f"c-{i}", i % G)
                for i in range(n)]))
    outs = asyncio.run(go())
    for i, out in enumerate(outs):
        assert out.texts == expected_texts(f"w{i} x y", 3 + i % 5)
    s = stats(d)
    for g in range(G):  # every rank admitted exactly the requests pinned to it
        mine = {x for x in s["ranks"][g]["admitted"] if x.startswith("c-")}
        assert mine == {f"c-{i}" for i in range(n) if i % G == g}
        assert s["ranks"][g]["running"] == 0
    kv = stats(p)["kv"]
    assert kv["issued"] - before["issued"] == n
    assert kv["released"]["pulled"] - before["released"]["pulled"] == n
    assert kv["held"] == 0
    # one release per issued hold, each recorded once
    assert len(kv["release_reason_by_id"]) == kv["issued"]


def test_decode_with_params_never_issued_is_refused(pd: Any) -> None:
    p, d = pd
    forged = {"do_remote_prefill": True, "do_remote_decode": False,
              "remote_engine_id": "emu-prefill-x", "remote_request_id": "never",
              "remote_block_ids": [1], "remote_host": "127.0.0.1",
              "remote_port": p.config.port}

    async def go() -> None:
        async with RemoteEngineClient() as c:
            dbody, headers = vllm_decode_request(body("a b", 3), forged, "forged", 0)
            with pytest.raises(EngineHTTPError) as e:
                async for _ in c.stream(d.url + endpoint_path(False), dbody, headers):
                    pass
            assert e.value.status == 400 and e.value.error is not None
            assert "never issued" in e.value.error.message
            assert e.value.error.param == "kv_transfer_params"
            # a second decode of already pulled parameters is refused the same way
            pre = await c.vllm_prefill(p.url, body("a b", 3), "twice")
            assert pre.kv_transfer_params is not None
            dbody, headers = vllm_decode_request(body("a b", 3), pre.kv_transfer_params,
                                                 "twice", 1)
            async for _ in c.stream(d.url + endpoint_path(False), dbody, headers):
                pass
            with pytest.raises(EngineHTTPError, match="already released"):
                async for _ in c.stream(d.url + endpoint_path(False), dbody, headers):
                    pass
            # a decode of another prompt than the one prefilled
            pre = await c.vllm_prefill(p.url, body("a b", 3), "other")
            assert pre.kv_transfer_params is not None
            dbody, headers = vllm_decode_request(body("a b c", 3), pre.kv_transfer_params,
                                                 "other", 1)
            with pytest.raises(EngineHTTPError, match="prompt_tokens"):
                async for _ in c.stream(d.url + endpoint_path(False), dbody, headers):
                    pass
    asyncio.run(go())


def test_bad_input_gets_the_engines_error_shape(pd: Any) -> None:
    p, d = pd
    url = d.url + "/v1/completions"
    cases: list[tuple[dict[str, Any], dict[str, str], str]] = [
        ({"prompt": "a", "max_tokens": 0}, {}, "max_tokens"),
        ({"prompt": "a", "bogus": 1}, {}, "bogus"),
        ({"prompt": "", "max_tokens": 2}, {}, "prompt"),
        ({"prompt": "a", "n": 2}, {}, "n"),
    ]
    ktp = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
           "remote_block_ids": [0], "remote_host": "127.0.0.1", "remote_port": p.config.port}
    for payload, headers, param in cases:
        r = httpx.post(url, json={**payload, "kv_transfer_params": ktp}, headers=headers)
        assert r.status_code == 400, payload
        err = r.json()["error"]
        assert err["code"] == 400 and err["type"] == "BadRequestError"
        assert param in err["message"]
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(p.url + "/v1/completions", json=body("a", 1, model="nope",
                   kv_transfer_params={"do_remote_decode": True}))
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = httpx.post(p.url + "/v1/completions", json=body("a", 5,
                   kv_transfer_params={"do_remote_decode": True}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"

    async def go() -> None:
        async with RemoteEngineClient() as c:
            pre = await c.vllm_prefill(p.url, body("a b", 2), "badrank")
            assert pre.kv_transfer_params is not None
            dbody, headers = vllm_decode_request(body("a b", 2), pre.kv_transfer_params,
                                                 "badrank", G)
            with pytest.raises(EngineHTTPError, match="out of range"):
                async for _ in c.stream(d.url + endpoint_path(False), dbody, headers):
                    pass
    asyncio.run(go())
    # the refused decode still freed the prefill's KV (the connector's rejection path)
    assert stats(p)["kv"]["release_reason_by_id"][pre_key(p, "badrank")] == "aborted"


def test_a_plain_request_to_the_prefill_role_is_served(pd: Any) -> None:
    """A real kv_producer serves a request without transfer parameters like any server
    (checked against vLLM 0.32): prefilled and decoded there, streamed or not."""
    p, _ = pd
    r = httpx.post(p.url + "/v1/completions", json=body("a b c", 4), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    assert r.json()["kv_transfer_params"] is None
    with httpx.stream("POST", p.url + "/v1/completions", json={**body("a b c", 3),
                                                               "stream": True}) as s:
        lines = [x for x in s.iter_lines() if x.startswith("data: ")]
    assert s.status_code == 200 and lines[-1] == "data: [DONE]" and len(lines) == 4, lines


def pre_key(p: EmulatorThread, ext: str) -> str:
    out = p.call(lambda emu: emu.counters.internal_id[ext])
    assert isinstance(out, str)
    return out


def test_prefill_endpoint_down_is_a_clear_error() -> None:
    async def go() -> None:
        async with RemoteEngineClient(Timeouts(connect_s=1.0)) as c:
            with pytest.raises(EngineUnreachable, match="cannot connect"):
                await c.vllm_prefill(f"http://127.0.0.1:{free_port()}", body("a", 2), "x")
            with pytest.raises(EngineUnreachable):
                await c.health(f"http://127.0.0.1:{free_port()}")
    asyncio.run(go())


def test_dropped_rank_breaks_its_streams_only_and_a_stall_is_detected(pd: Any) -> None:
    p, d = pd

    async def one(c: RemoteEngineClient, rid: str, rank: int, n: int) -> Any:
        try:
            return await vllm_pd(c, p.url, d.url, body("q r", n), rid, rank)
        except Exception as exc:
            return exc

    async def go() -> None:
        async with RemoteEngineClient(Timeouts(stall_s=0.5)) as c:
            tasks = [asyncio.ensure_future(one(c, f"f-{g}", g, 400)) for g in range(G)]
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient() as h:
                r = await h.post(d.url + "/emulator/fault", json={"rank": 1, "mode": "drop"})
                assert r.json()["affected"] == ["f-1"]
                for g in (0, 2, 3):
                    await h.post(d.url + "/emulator/fault", json={"rank": g, "mode": "stall"})
                res = await asyncio.gather(*tasks)
                assert isinstance(res[1], StreamBroken)
                for g in (0, 2, 3):
                    assert isinstance(res[g], StreamStalled), res[g]
                for g in range(G):
                    await h.post(d.url + "/emulator/fault", json={"rank": g, "mode": "recover"})
            # after recovery every rank serves again
            outs = await asyncio.gather(*[one(c, f"after-{g}", g, 3) for g in range(G)])
            assert all(o.texts == expected_texts("q r", 3) for o in outs)
    asyncio.run(go())
    s = stats(d)
    assert all(r["running"] == 0 for r in s["ranks"])  # the stalled streams were aborted


def test_client_disconnect_aborts_and_frees_the_slot(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            pre = await c.vllm_prefill(p.url, body("d e", 500), "gone")
            assert pre.kv_transfer_params is not None
            dbody, headers = vllm_decode_request(body("d e", 500), pre.kv_transfer_params,
                                                 "gone", 3)
            async for ev in c.stream(d.url + endpoint_path(False), dbody, headers):
                if isinstance(ev, TokenChunk) and ev.completion_tokens >= 3:
                    break  # leaving the stream closes the connection
    asyncio.run(go())
    deadline = time.monotonic() + 5
    while stats(d)["ranks"][3]["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    rank3 = stats(d)["ranks"][3]
    assert rank3["running"] == 0 and rank3["aborted"] >= 1


def test_metrics_report_running_requests_per_rank(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            tasks = [asyncio.ensure_future(vllm_pd(c, p.url, d.url, body("m n", 150),
                                                   f"m-{i}", 2)) for i in range(3)]
            await asyncio.sleep(0.25)
            loads = await c.vllm_rank_loads(d.url, "emulated")
            assert loads[2].running == 3 and loads[0].running == 0
            assert loads[2].kv_usage is not None and loads[2].kv_usage > 0
            await asyncio.gather(*tasks)
            assert (await c.vllm_rank_loads(d.url))[2].running == 0
    asyncio.run(go())


def test_prefill_kv_expires_or_is_cancelled() -> None:
    with servers(config("vllm", "prefill", kv_ttl_s=0.3)) as (p,):
        async def go() -> None:
            async with RemoteEngineClient() as c:
                await c.vllm_prefill(p.url, body("a b", 3), "exp")
                await c.vllm_prefill(p.url, body("a b", 3), "can")
                assert await c.vllm_cancel(p.url, "can")
                assert not await c.vllm_cancel(p.url, "can")
        asyncio.run(go())
        time.sleep(1.5)
        kv = stats(p)["kv"]
        assert kv["held"] == 0
        assert kv["released"] == {"pulled": 0, "aborted": 1, "expired": 1}


def test_lockstep_slowest_rank_sets_the_step() -> None:
    # rank 1 idles but its b = 50 ms sets every step: 8 tokens take >= 0.4 s
    cfgs = (config("vllm", "prefill"),
            config("vllm", "decode", 2, step_b_s=(0.001, 0.05)))
    with servers(*cfgs) as (p, d):
        async def go() -> float:
            async with RemoteEngineClient() as c:
                t0 = time.perf_counter()
                out = await vllm_pd(c, p.url, d.url, body("s t", 8), "slow", 0)
                assert len(out.texts) == 8
                return time.perf_counter() - t0
        assert asyncio.run(go()) >= 0.8 * 8 * 0.05


def test_one_server_per_rank() -> None:
    pre_cfg = config("vllm", "prefill")
    port = free_port()
    while any(_busy(port + g) for g in range(3)):
        port = free_port()
    dec_cfg = config("vllm", "decode", 3, port_per_rank=True)
    object.__setattr__(dec_cfg, "port", port)
    with servers(pre_cfg, dec_cfg) as (p, d):
        async def go() -> None:
            async with RemoteEngineClient() as c:
                for g in range(3):
                    out = await vllm_pd(c, p.url, d.rank_url(g), body("u v", 2), f"pr-{g}",
                                        None)
                    assert out.texts == expected_texts("u v", 2)
                text = await c.metrics_text(d.rank_url(1))
                assert single_rank_load(text, 1).rank == 1
                with pytest.raises(EngineHTTPError, match="this server is data parallel"):
                    await vllm_pd(c, p.url, d.rank_url(1), body("u v", 2), "pr-x", 2)
        asyncio.run(go())
        ranks = stats(d)["ranks"]
        assert [r["admitted"] for r in ranks] == [["pr-0"], ["pr-1"], ["pr-2"]]


def _busy(port: int) -> bool:
    import socket
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_chat_non_streamed_decode_and_api_key() -> None:
    key = "s3cret"
    with servers(config("vllm", "prefill", api_key=key),
                 config("vllm", "decode", 2, api_key=key)) as (p, d):
        r = httpx.post(p.url + "/v1/completions", json=body("a", 1))
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert httpx.get(d.url + "/health").status_code == 200  # health stays open
        chat = {"model": "emulated", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi there"}]}
        prompt = "user: hi there\nassistant:"

        async def go() -> None:
            async with RemoteEngineClient(api_key=key) as c:
                pre = await c.vllm_prefill(p.url, chat, "chat-1", chat=True)
                assert pre.kv_transfer_params is not None
                dbody, headers = vllm_decode_request(chat, pre.kv_transfer_params, "chat-1",
                                                     1)
                evs = [ev async for ev in c.stream(d.url + endpoint_path(True), dbody,
                                                   headers)]
                toks = [e for e in evs if isinstance(e, TokenChunk)]
                assert [t.new_tokens for t in toks] == [0, 1, 1, 1, 1]  # role chunk first
                assert [t.text for t in toks[1:]] == expected_texts(prompt, 4)
                pre = await c.vllm_prefill(p.url, chat, "chat-2", chat=True)
                assert pre.kv_transfer_params is not None
                dbody, headers = vllm_decode_request(chat, pre.kv_transfer_params, "chat-2",
                                                     0, stream=False)
                answer = await c.request_json("POST", d.url + endpoint_path(True), dbody,
                                              headers)
                assert answer["choices"][0]["message"]["content"] == "".join(
                    expected_texts(prompt, 4))
                assert answer["usage"]["completion_tokens"] == 4
                assert answer["id"] == "chatcmpl-chat-2"
        asyncio.run(go())
