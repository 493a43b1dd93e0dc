"""The ingress Streamer against fake actor handles (no Ray): what happens to a KV that no
decode replica will ever pull, to a pool entry whose client went away, and to a graph
that is full.

Why it matters: a Mooncake key stays in the prefill worker's segment until someone
removes it, so every path that abandons a prefilled request must release its handle
(through the keeper, the same for every transport); a pool entry the ingress forgets to
drop is resubmitted after a scheduler restart; and a request the graph cannot take
must be refused before its prefill runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from br_serve.engine.base import SamplingParams
from br_serve.serve.config import parse_graph_config
from br_serve.serve.frontend import streams
from br_serve.serve.frontend.streams import GenerateError, Streamer
from br_serve.serve.wire.messages import Admitted, PrefillOutput
from br_serve.transport.base import KVHandle
from br_serve.transport.lease import KVLease


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

    return FakeActor(poll=poll, abort=None)


def _world(submit: str, transport: str = "mooncake", **cfg: Any
           ) -> tuple[Streamer, FakeActor, list[FakeActor], FakeActor]:
    """A Streamer over two fake decode replicas; the scheduler answers ``submit``.
    Returns (streamer, scheduler, decode replicas, keeper)."""
    keeper = FakeActor(release=None)
    sched = FakeActor(submit=submit, summary=None, cancel=None, replica_lost=None)
    dec = [_decode(), _decode()]
    conf = parse_graph_config(replicas=len(dec), transport="objref", **cfg)
    lease = KVLease(None, keeper=keeper)
    return Streamer(conf, _prefill(transport), sched, dec, lease), sched, dec, keeper


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
        s, _, _, keeper = _world("full", transport)
        with pytest.raises(GenerateError) as err:
            await s.generate("a b c", _params()).__anext__()
        assert err.value.status == 429
        await asyncio.sleep(0)  # the release is fire-and-forget
        # once, through the keeper, which frees it through its own transport
        assert [h.key for (h,) in keeper.called("release")] == [f"kv-{s.owner}-1"]
        assert s.gate.inside == 0  # the gate let it go again
        await s.close()

    asyncio.run(go())


def test_client_gone_before_admission_drops_entry_and_kv() -> None:
    async def go() -> None:
        s, sched, _, keeper = _world("queued")
        await _first_then_close(s)
        rid = f"{s.owner}-1"
        assert s._pending == {} and s._queues == {}
        assert sched.called("cancel") == [(rid,)]  # out of the scheduler's pool too
        await asyncio.sleep(0)
        assert [h.key for (h,) in keeper.called("release")] == [f"kv-{rid}"]
        await s.close()

    asyncio.run(go())


def test_client_gone_while_its_submit_waits_drops_entry_and_kv() -> None:
    """A client that leaves before the response began is seen as a cancellation of the
    handler (Serve's proxy and the ingress replica's own HTTP server both cancel it),
    here while the submit waits: it rides out a scheduler restart for up to a minute.
    Before: the entry stayed in ``_pending``, the restarted scheduler got it again from
    the ingress's resubmission, and it ran to its end for nobody (its inbox stayed too,
    so its admission was not aborted); its KV was never released."""
    async def go() -> None:
        s, sched, dec, keeper = _world("queued")
        sched.answers["submit"] = lambda entry: _NEVER  # the scheduler is restarting
        rid = f"{s.owner}-1"
        task = asyncio.ensure_future(s.generate("a b c", _params()).__anext__())
        while not sched.called("submit"):
            await asyncio.sleep(0)
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s._pending == {} and s._queues == {}
        assert sched.called("cancel") == [(rid,)]  # should the submit get through
        await asyncio.sleep(0)
        assert [h.key for (h,) in keeper.called("release")] == [f"kv-{rid}"]
        assert s.gate.inside == 0
        # a submit that got through after all: its admission is aborted on arrival
        s._route(0, [Admitted(rid, 0)])
        assert dec[0].called("abort") == [(rid,)]
        await s.close()

    asyncio.run(go())


def test_a_full_graph_is_refused_before_prefill_with_retry_after() -> None:
    """Before: a request beyond the pool's capacity was prefilled first and refused by
    the scheduler afterwards (a late 429, no Retry-After)."""
    async def go() -> None:
        s, sched, _, _ = _world("queued", slots=1, pool_capacity=1)  # room for 2 + 1
        s.gate.observe(alive_replicas=2, scheduler_requests=3)
        with pytest.raises(GenerateError) as err:
            await s.generate("a b c", _params()).__anext__()
        assert err.value.status == 429 and err.value.retry_after_s == 1
        assert s.prefill.called("prefill") == [] and sched.called("submit") == []
        s.gate.observe(alive_replicas=2, scheduler_requests=2)
        gen = s.generate("a b c", _params())
        assert (await gen.__anext__()).index == 0  # room again: admitted
        await gen.aclose()
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
        await asyncio.sleep(0)
        assert keeper.called("release") == []  # the replica pulled it and released it
        await s.close()

    asyncio.run(go())


@pytest.mark.parametrize("chat", [False, True])
def test_sse_chunk_template_writes_the_same_bytes(chat: bool) -> None:
    """The ingress splices each middle token into a cached chunk: byte for byte what
    json.dumps(oa.chunk_body(...)) writes."""
    import json

    from br_serve.serve.frontend import openai_api as oa
    from br_serve.serve.frontend.ingress import _ChunkTemplate

    tpl = _ChunkTemplate("cmpl-x", "br-emulated", chat)
    for text in (" t1", 'a"b\\', "é\n\u2028", ""):
        want = json.dumps(oa.chunk_body("cmpl-x", "br-emulated", text, None, chat))
        assert tpl.event(text) == f"data: {want}\n\n"


def _tok(rid: str, index: int, last: bool = False) -> tuple[Any, ...]:
    return (rid, -1, f"t{index}", index, last, "length" if last else None)


def test_last_tokens_that_trail_the_finish_report_are_not_a_loss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured on real vLLM: the scheduler heard that the replica finished a request
    before this ingress got its last tokens, and the watchdog's one check re-prefilled
    a stream that was complete. Here the first check finds the request nowhere while
    its last tokens arrive: the stream ends with them, prefilled once."""
    monkeypatch.setattr(streams, "_WATCHDOG_S", 0.05)

    async def go() -> None:
        s, sched, _, _ = _world("queued")
        rid = f"{s.owner}-1"
        loop = asyncio.get_running_loop()

        def submit(entry: Any) -> str:  # admitted on replica 0, one token, then silence
            loop.call_soon(s._route, 0, [Admitted(rid, 0), _tok(rid, 1)])
            return "queued"

        def locate(r: str) -> tuple[str, None]:  # finished there; last tokens in flight
            loop.call_soon(s._route, 0, [_tok(rid, 2), _tok(rid, 3, last=True)])
            return ("unknown", None)

        sched.answers.update(submit=submit, locate=locate)
        toks = [t async for t in s.generate("a b c", _params(4))]
        assert [t.index for t in toks] == [0, 1, 2, 3] and toks[-1].finished
        assert all(t.error is None for t in toks)
        assert len(s.prefill.called("prefill")) == 1 and len(sched.called("locate")) == 1
        await s.close()

    asyncio.run(asyncio.wait_for(go(), 20))  # a re-prefill loop would not end


def test_a_request_no_replica_runs_is_lost_after_two_silent_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "_WATCHDOG_S", 0.05)

    async def go() -> None:
        s, sched, _, _ = _world("queued")
        rid = f"{s.owner}-1"
        loop = asyncio.get_running_loop()

        def submit(entry: Any) -> str:
            if entry.request_id == rid:
                loop.call_soon(s._route, 0, [Admitted(rid, 0), _tok(rid, 1)])
            return "queued"

        sched.answers.update(submit=submit, locate=("unknown", None))
        got: list[int] = []

        async def read() -> None:
            async for t in s.generate("a b c", _params(4)):
                got.append(t.index)

        reader = asyncio.create_task(read())
        for _ in range(200):  # the re-prefill comes after two checks, not one
            if len(s.prefill.called("prefill")) == 2:
                break
            await asyncio.sleep(0.01)
        assert got[:2] == [0, 1]
        assert len(s.prefill.called("prefill")) == 2
        assert len(sched.called("locate")) == 2
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await s.close()

    asyncio.run(asyncio.wait_for(go(), 20))  # a re-prefill loop would not end
