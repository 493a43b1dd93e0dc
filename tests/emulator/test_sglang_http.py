"""The SGLang-protocol emulator over real HTTP, driven by br_serve.remote's client."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from br_serve.emulator.server import EmulatorThread
from br_serve.remote.client import RemoteEngineClient
from br_serve.remote.errors import EngineHTTPError, EngineTimeout
from br_serve.remote.requests import (
    Bootstrap,
    endpoint_path,
    new_bootstrap_room,
    sglang_decode_request,
)
from br_serve.remote.sse import TokenChunk
from tests.emulator.helpers import config, expected_texts, servers, sglang_pd
from tests.serve.helpers import free_port

G = 4
RNG = random.Random(15)


@pytest.fixture(scope="module")
def pd() -> Iterator[tuple[EmulatorThread, EmulatorThread]]:
    with servers(config("sglang", "prefill", kv_ttl_s=30),
                 config("sglang", "decode", G, bootstrap_wait_s=2.0)) as (p, d):
        yield p, d


def stats(t: EmulatorThread) -> dict[str, Any]:
    return dict(httpx.get(t.url + "/emulator/stats").json())


def boot(p: EmulatorThread) -> Bootstrap:
    return Bootstrap("127.0.0.1", p.config.port, new_bootstrap_room(RNG))


def body(prompt: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": "emulated", "prompt": prompt, "max_tokens": max_tokens, **kw}


def test_tokens_equal_max_tokens_and_the_prefill_answers_after_the_pull(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            out = await sglang_pd(c, p.url, d.url, boot(p), body("alpha beta", 6), "s-1", 1)
        assert out.texts == expected_texts("alpha beta", 6)
        assert out.prefill_text == out.texts[0]
        assert out.done is not None and out.done.completion_tokens == 6
    asyncio.run(go())
    assert "s-1" in stats(d)["ranks"][1]["admitted"]


def test_timeline_marks_each_hop_in_order_with_the_seed(pd: Any) -> None:
    p, d = pd
    b = boot(p)

    async def go() -> None:
        async with RemoteEngineClient() as c:
            await sglang_pd(c, p.url, d.url, b, body("gamma delta", 4, seed=77), "s-tl", 0)
    asyncio.run(go())
    pm = httpx.get(p.url + "/emulator/timeline").json()["marks"][str(b.room)]
    dm = httpx.get(d.url + "/emulator/timeline").json()["marks"][str(b.room)]
    assert pm["seed"] == dm["seed"] == 77 and dm["rank"] == 0
    assert pm["prefill_in"] <= pm["prefill_done"] <= pm["kv_released"]
    assert dm["decode_in"] <= dm["kv_ready"] <= dm["first_token"]
    assert pm["prefill_done"] <= dm["kv_ready"]


@pytest.mark.slow
def test_hundred_concurrent_requests_pinned_and_released_exactly_once(pd: Any) -> None:
    p, d = pd
    n = 100
    before = stats(p)["kv"]["issued"]

    async def go() -> list[Any]:
        async with RemoteEngineClient() as c:
            return list(await asyncio.gather(*[
                sglang_pd(c, p.url, d.url, boot(p), body(f"v{i} w", 2 + i % 4), f"h-{i}",
                          i % G) for i in range(n)]))
    outs = asyncio.run(go())
    assert all(o.texts == expected_texts(f"v{i} w", 2 + i % 4) for i, o in enumerate(outs))
    s = stats(d)
    for g in range(G):
        mine = {x for x in s["ranks"][g]["admitted"] if x.startswith("h-")}
        assert mine == {f"h-{i}" for i in range(n) if i % G == g}
    kv = stats(p)["kv"]
    assert kv["issued"] - before == n and kv["held"] == 0
    assert list(kv["release_reason_by_id"].values()).count("pulled") >= n
    assert len(kv["release_reason_by_id"]) == kv["issued"]


def test_header_overrides_body_rank_and_out_of_range_is_refused(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            b = boot(p)
            prefill = asyncio.ensure_future(c.sglang_prefill(p.url, body("x", 2), b, "hdr"))
            dbody = sglang_decode_request(body("x", 2), b, "hdr", rank=0)
            async for _ in c.stream(d.url + endpoint_path(False), dbody,
                                    {"X-Data-Parallel-Rank": "3"}):
                pass
            await prefill
            dbody = sglang_decode_request(body("x", 2), boot(p), "far", rank=G)
            with pytest.raises(EngineHTTPError, match="out of range") as e:
                async for _ in c.stream(d.url + endpoint_path(False), dbody):
                    pass
            assert e.value.error is not None and e.value.error.code == 400
    asyncio.run(go())
    assert "hdr" in stats(d)["ranks"][3]["admitted"]


def test_room_never_opened_is_refused_and_a_late_prefill_still_meets(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            dbody = sglang_decode_request(body("y z", 2), boot(p), "lonely", rank=0)
            t0 = time.perf_counter()
            with pytest.raises(EngineHTTPError, match="never issued") as e:
                async for _ in c.stream(d.url + endpoint_path(False), dbody):
                    pass
            assert e.value.status == 400 and time.perf_counter() - t0 >= 1.5
            # the decode arrives first and waits for the room (a rendezvous)
            b = boot(p)
            dbody = sglang_decode_request(body("y z", 2), b, "early", rank=2)

            async def consume() -> list[str]:
                return [ev.text async for ev in c.stream(d.url + endpoint_path(False), dbody)
                        if isinstance(ev, TokenChunk)]
            decode = asyncio.ensure_future(consume())
            await asyncio.sleep(0.3)
            assert not decode.done()
            pre = await c.sglang_prefill(p.url, body("y z", 2), b, "early")
            assert await decode == expected_texts("y z", 2)
            assert pre.text == expected_texts("y z", 2)[0]
    asyncio.run(go())


def test_unpulled_room_expires_and_abort_releases() -> None:
    with servers(config("sglang", "prefill", kv_ttl_s=0.3)) as (p,):
        async def go() -> None:
            async with RemoteEngineClient() as c:
                with pytest.raises(EngineHTTPError, match="bootstrap timeout") as e:
                    await c.sglang_prefill(p.url, body("a", 2), boot(p), "nobody")
                assert e.value.status == 500 and e.value.retryable
                task = asyncio.ensure_future(
                    c.sglang_prefill(p.url, body("a", 2), boot(p), "ab"))
                await asyncio.sleep(0.1)
                await c.sglang_abort(p.url, "ab")
                with pytest.raises(EngineHTTPError, match="aborted"):
                    await task
        asyncio.run(go())
        kv = stats(p)["kv"]
        assert kv["released"] == {"pulled": 0, "aborted": 1, "expired": 1}


def test_loads_and_error_shapes(pd: Any) -> None:
    p, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            tasks = [asyncio.ensure_future(sglang_pd(c, p.url, d.url, boot(p),
                                                     body("l m", 150), f"l-{i}", 1))
                     for i in range(2)]
            await asyncio.sleep(0.3)
            loads = await c.sglang_rank_loads(d.url)
            assert loads[1].running == 2 and loads[0].running == 0
            assert loads[1].used_tokens is not None and loads[1].used_tokens > 0
            await asyncio.gather(*tasks)
    asyncio.run(go())
    r = httpx.get(d.url + "/v1/loads", params={"include": "core,bogus"})
    assert r.status_code == 400
    err = r.json()
    assert err["object"] == "error" and err["code"] == 400 and "bogus" in err["message"]
    r = httpx.post(d.url + "/v1/completions", json=body("a", 2, bootstrap_room=1,
                   bootstrap_host="127.0.0.1", bootstrap_port=p.config.port, weird=True))
    assert r.status_code == 400 and r.json()["param"] == "weird"
    r = httpx.post(d.url + "/v1/completions", json=body("a", 2))
    assert r.status_code == 400 and r.json()["param"] == "bootstrap_room"


def test_prefill_server_down_is_a_retryable_error(pd: Any) -> None:
    _, d = pd

    async def go() -> None:
        async with RemoteEngineClient() as c:
            b = Bootstrap("127.0.0.1", free_port(), 7)
            dbody = sglang_decode_request(body("q", 2), b, "down", rank=0)
            with pytest.raises(EngineHTTPError, match="not reachable") as e:
                async for _ in c.stream(d.url + endpoint_path(False), dbody):
                    pass
            assert e.value.status == 503 and e.value.retryable
    asyncio.run(go())


def test_prefill_client_gone_releases_the_room() -> None:
    with servers(config("sglang", "prefill")) as (p,):
        async def go() -> None:
            async with RemoteEngineClient() as c:
                with pytest.raises(EngineTimeout):
                    await c.sglang_prefill(p.url, body("a", 2), boot(p), "left",
                                           timeout_s=0.3)
        asyncio.run(go())
        deadline = time.monotonic() + 5
        while stats(p)["kv"]["held"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stats(p)["kv"]["released"]["aborted"] == 1
