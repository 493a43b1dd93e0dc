"""The remote-rank proxy (RemoteDecodeEngine) against engine emulators, without Ray."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from br_serve.engine.base import SamplingParams, TokenEvent
from br_serve.engine.remote import RemoteDecodeEngine, RemoteRankDown
from br_serve.remote.client import RemoteEngineClient, Timeouts
from br_serve.remote.errors import EngineDisconnected
from br_serve.remote.requests import Bootstrap
from br_serve.remote.ticket import RemoteTicket, completion_body
from br_serve.transport.base import TransportError
from br_serve.transport.remote import RemoteTicketTransport
from tests.emulator.helpers import config, expected_texts, servers

MODEL = "emulated"


def _vllm_tickets(prefill_url: str, n: int, max_tokens: int) -> list[RemoteTicket]:
    async def go() -> list[RemoteTicket]:
        async with RemoteEngineClient() as c:
            out = []
            for i in range(n):
                body = completion_body(f"p{i} a b c", SamplingParams(max_tokens=max_tokens,
                                                                      seed=i), MODEL)
                res = await c.vllm_prefill(prefill_url, body, f"r{i}")
                assert res.kv_transfer_params is not None
                out.append(RemoteTicket("vllm", prefill_url, f"r{i}", body,
                                        res.prompt_tokens,
                                        kv_transfer_params=res.kv_transfer_params))
            return out
    return asyncio.run(go())


def _drive(eng: RemoteDecodeEngine, deadline_s: float = 20.0
           ) -> tuple[dict[str, list[TokenEvent]], list[tuple[str, str, bool]]]:
    got: dict[str, list[TokenEvent]] = {}
    failed: list[tuple[str, str, bool]] = []
    end = time.monotonic() + deadline_s
    while eng.running() and time.monotonic() < end:
        for e in eng.step():
            got.setdefault(e.request_id, []).append(e)
        failed += eng.take_failures()
    return got, failed


def _stats(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(f"{url}/emulator/stats", timeout=5).json()
    return out


def test_vllm_rank_streams_exact_tokens_and_load() -> None:
    with servers(config("vllm", "prefill"), config("vllm", "decode", 2)) as (p, d):
        tickets = _vllm_tickets(p.url, 6, 5)
        eng = RemoteDecodeEngine(d.url, 1)
        eng.wait_healthy(5)
        for t in tickets:
            eng.admit(t.request_id, t, t.prompt_tokens, -1, SamplingParams())
        assert eng.running() == 6
        assert eng.load_tokens() == sum(t.prompt_tokens for t in tickets)
        with pytest.raises(ValueError, match="already running"):
            eng.admit("r0", tickets[0], 1, -1, SamplingParams())
        got, failed = _drive(eng)
        assert not failed and eng.running() == 0
        for i, t in enumerate(tickets):
            evs = got[t.request_id]
            assert [e.index for e in evs] == list(range(5))
            assert [e.text for e in evs] == expected_texts(f"p{i} a b c", 5, i)
            assert evs[-1].finished and evs[-1].finish_reason == "length"
        st = _stats(d.url)
        assert sorted(st["ranks"][1]["admitted"]) == sorted(t.request_id for t in tickets)
        assert not st["ranks"][0]["admitted"]
        assert _stats(p.url)["kv"]["released"]["pulled"] == 6
        eng.close()


def test_abort_before_the_first_token_releases_the_prefill_hold() -> None:
    slow = config("vllm", "decode", 1, step_b_s=(0.5,))
    with servers(config("vllm", "prefill"), slow) as (p, d):
        [t] = _vllm_tickets(p.url, 1, 50)
        eng = RemoteDecodeEngine(d.url, 0)
        eng.admit(t.request_id, t, t.prompt_tokens, -1, SamplingParams())
        eng.abort(t.request_id)
        assert eng.running() == 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            kv = _stats(p.url)["kv"]
            if kv["held"] == 0:
                break
            time.sleep(0.05)
        assert kv["held"] == 0 and kv["issued"] == 1
        eng.close()


def test_dropped_rank_fails_its_streams_then_the_rank_is_down() -> None:
    dec = config("vllm", "decode", 1, step_b_s=(0.02,), enable_fault_injection=True,
                 port_per_rank=True)
    with servers(config("vllm", "prefill"), dec) as (p, d):
        tickets = _vllm_tickets(p.url, 3, 400)
        eng = RemoteDecodeEngine(d.url, None, Timeouts(connect_s=1.0, stall_s=2.0))
        for t in tickets:
            eng.admit(t.request_id, t, t.prompt_tokens, -1, SamplingParams())
        for _ in range(5):
            eng.step()
        r = httpx.post(f"{d.url}/emulator/fault", json={"rank": 0, "mode": "drop"})
        assert r.status_code == 200, r.text
        failed: list[tuple[str, str, bool]] = []
        with pytest.raises(RemoteRankDown):
            end = time.monotonic() + 10
            while time.monotonic() < end:
                eng.step()
                failed += eng.take_failures()
        end = time.monotonic() + 10  # the others' failures land as their probes end
        while len(failed) < len(tickets) and time.monotonic() < end:
            failed += eng.take_failures()
            time.sleep(0.05)
        assert sorted(f[0] for f in failed) == sorted(t.request_id for t in tickets)
        assert all(f[2] for f in failed)  # retryable: re-prefill elsewhere
        eng.close()


def test_sglang_rank_through_the_bootstrap_room() -> None:
    with servers(config("sglang", "prefill"), config("sglang", "decode", 2)) as (p, d):
        host, port = p.url.removeprefix("http://").split(":")
        boot = Bootstrap(host, int(port), 12345)
        body = completion_body("x y z", SamplingParams(max_tokens=4, seed=7), MODEL)
        ticket = RemoteTicket("sglang", p.url, "s1", body, 3, bootstrap=boot)

        async def prefill() -> Any:
            async with RemoteEngineClient() as c:
                return await c.sglang_prefill(p.url, body, boot, "s1")

        eng = RemoteDecodeEngine(d.url, 0)
        loop = asyncio.new_event_loop()
        call = loop.create_task(prefill())
        loop.run_until_complete(asyncio.sleep(0.1))  # the prefill opens its room
        eng.admit("s1", ticket, 3, -1, SamplingParams())
        got, failed = _drive(eng)
        assert not failed
        assert [e.text for e in got["s1"]] == expected_texts("x y z", 4, 7)
        loop.run_until_complete(call)
        loop.close()
        eng.close()


def test_remote_transport_release_cancels_once_and_refuses_foreign_payloads() -> None:
    with servers(config("vllm", "prefill")) as (p,):
        [t] = _vllm_tickets(p.url, 1, 5)
        tr = RemoteTicketTransport()
        h = tr.put("r0", t)
        assert h.freed_by_consumer and tr.get(h) is t
        tr.release(h)
        tr.release(h)  # the engine answers 404 now: still fine
        kv = _stats(p.url)["kv"]
        assert kv["held"] == 0 and kv["released"]["aborted"] == 1
        with pytest.raises(TransportError, match="RemoteTicket"):
            tr.put("x", b"bytes")
        tr.close()


def test_a_ticket_whose_prefill_hold_expired_fails_retryable() -> None:
    # the prefill releases unpulled KV after 0.3 s (its own bound, as vLLM's 480 s)
    with servers(config("vllm", "prefill", kv_ttl_s=0.3), config("vllm", "decode")) as (p, d):
        [t] = _vllm_tickets(p.url, 1, 5)
        deadline = time.monotonic() + 5
        while _stats(p.url)["kv"]["held"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _stats(p.url)["kv"]["released"]["expired"] == 1
        eng = RemoteDecodeEngine(d.url, 0)
        eng.admit(t.request_id, t, t.prompt_tokens, -1, SamplingParams())
        got, failed = _drive(eng)
        assert not got and [f[0] for f in failed] == [t.request_id]
        assert failed[0][2], failed  # retryable: the ingress prefills it again
        eng.close()


class _LosesPrefills(httpx.AsyncBaseTransport):
    """Loses the first ``n`` prefill POSTs the way a pooled connection the server is
    closing loses them: ``ReadError``, and the server never sees the request."""

    def __init__(self, n: int) -> None:
        self.left = n
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.left and request.url.path == "/v1/completions":
            self.left -= 1
            raise httpx.ReadError("Server disconnected", request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.mark.parametrize("tries", [3, 1])
def test_an_sglang_prefill_whose_connection_is_lost_is_sent_again(tries: int) -> None:
    """Two of the prefill's sends are lost unanswered: with 3 tries the room opens once
    and the decode streams exactly; with 1 the call fails and no room opens (the decode
    would wait for KV that never comes: the CI failure this retry fixes)."""
    with servers(config("sglang", "prefill"), config("sglang", "decode", 2)) as (p, d):
        host, port = p.url.removeprefix("http://").split(":")
        boot = Bootstrap(host, int(port), 777)
        body = completion_body("x y z", SamplingParams(max_tokens=4, seed=7), MODEL)

        async def prefill() -> Any:
            async with RemoteEngineClient(transport=_LosesPrefills(2)) as c:
                return await c.sglang_prefill(p.url, body, boot, "s2", tries=tries)

        loop = asyncio.new_event_loop()
        call = loop.create_task(prefill())
        loop.run_until_complete(asyncio.sleep(0.2))
        if tries == 1:
            with pytest.raises(EngineDisconnected):
                loop.run_until_complete(call)
            assert _stats(p.url)["kv"]["issued"] == 0
        else:
            eng = RemoteDecodeEngine(d.url, 1)
            eng.admit("s2", RemoteTicket("sglang", p.url, "s2", body, 3, bootstrap=boot), 3,
                      -1, SamplingParams())
            got, failed = _drive(eng)
            assert not failed
            assert [e.text for e in got["s2"]] == expected_texts("x y z", 4, 7)
            loop.run_until_complete(call)
            kv = _stats(p.url)["kv"]
            assert kv["issued"] == 1 and kv["held"] == 0, kv
            eng.close()
        loop.close()


def test_idle_pooled_connections_are_dropped_after_keepalive_s() -> None:
    """A connection idle longer than ``keepalive_s`` is not reused (the engine server
    closes its own at 5 s: reusing one it is closing loses the request)."""
    accepted = 0

    async def go() -> None:
        nonlocal accepted

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            while await r.readuntil(b"\r\n\r\n"):
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await w.drain()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/x"
        async with RemoteEngineClient(Timeouts(keepalive_s=0.3)) as c:
            await c.request_json("GET", url)
            await c.request_json("GET", url)  # reused at once
            assert accepted == 1
            await asyncio.sleep(0.6)
            await c.request_json("GET", url)  # idle past keepalive_s: a new connection
            assert accepted == 2
        srv.close()
    asyncio.run(go())
