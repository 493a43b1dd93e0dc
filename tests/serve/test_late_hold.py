"""Remote-engine tickets held off the request's path, without Ray.

The ingress prefills on a remote engine itself and hands the ticket to the KV keeper
without waiting (``KVLease.hold_soon``: one ``hold_many`` per event-loop turn). So a
release can reach the keeper before the hold: a decode replica's (it took the KV) or
the ingress's own (it gave the request up). Either order must end the same way: a taken
ticket is never cancelled on its engine, a given-up one always is, and nothing stays
held.
"""

from __future__ import annotations

import asyncio
from typing import Any

from br_serve.engine.base import SamplingParams
from br_serve.serve.frontend.events import GenerateError
from br_serve.serve.frontend.prefilling import Prefill
from br_serve.serve.wire.messages import PrefillOutput
from br_serve.transport.base import KVHandle
from br_serve.transport.keeper import KVKeeper
from br_serve.transport.lease import KVLease
from tests.serve.helpers import RecordingTransport


def _ticket(key: str) -> KVHandle:
    return KVHandle("remote", key, 0, freed_by_consumer=True)


def _keeper() -> tuple[KVKeeper, RecordingTransport]:
    keeper = KVKeeper(ttl_s=10.0)
    keeper._transport = transport = RecordingTransport()
    return keeper, transport


def test_keeper_a_hold_after_a_consumed_release_is_void() -> None:
    keeper, transport = _keeper()

    async def scenario() -> dict[str, int]:
        await keeper.release(_ticket("a"), consumed=True)  # the decode was first
        await keeper.hold_many([_ticket("a")])
        await keeper.release(_ticket("a"))  # the ingress, racing: nothing to free
        return await keeper.counts()

    counts = asyncio.run(scenario())
    assert transport.releases == []  # never cancelled on the engine
    assert counts["held"] == 0 and counts["late"] == 1 and counts["handed_over"] == 1


def test_keeper_a_hold_after_a_give_up_frees_the_engine_hold() -> None:
    keeper, transport = _keeper()

    async def scenario() -> int:
        await keeper.release(_ticket("b"))  # the ingress gave it up before its hold came
        assert transport.releases == []  # not held: nothing known to free yet
        await keeper.hold(_ticket("b"))
        return await keeper.size()

    assert asyncio.run(scenario()) == 0
    assert transport.releases == ["b"]  # freed once, when the hold came


def test_keeper_in_order_is_unchanged() -> None:
    keeper, transport = _keeper()

    async def scenario() -> int:
        await keeper.hold_many([_ticket("c"), _ticket("d")])
        await keeper.release(_ticket("c"), consumed=True)
        await keeper.release(_ticket("d"))
        return await keeper.size()

    assert asyncio.run(scenario()) == 0
    assert transport.releases == ["d"] and keeper.late == 0


class _Keeper:
    """A keeper handle whose calls are recorded in order and answered at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.hold_many = self._method("hold_many")
        self.release = self._method("release")

    def _method(self, name: str) -> Any:
        keeper = self

        class _M:
            def remote(self, arg: Any, *_: Any) -> Any:
                keys = [h.key for h in arg] if isinstance(arg, list) else [arg.key]
                keeper.calls.append((name, keys))
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(None)
                return fut
        return _M()


def test_hold_soon_batches_a_turn_and_goes_before_a_release() -> None:
    keeper = _Keeper()
    lease = KVLease(None, keeper=keeper)

    async def scenario() -> None:
        for k in ("a", "b", "c"):
            lease.hold_soon(_ticket(k))
        await asyncio.sleep(0)  # one turn: one call for the three
        await asyncio.sleep(0)
        lease.hold_soon(_ticket("d"))
        lease.release(_ticket("d"))  # queued hold is sent first
        await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert keeper.calls == [("hold_many", ["a", "b", "c"]), ("hold_many", ["d"]),
                            ("release", ["d"])]
    assert lease.holds_lost == 0


class _Remote:
    """Stands in for a RemotePrefiller: called in the loop, its tickets unheld."""

    def __init__(self, out: PrefillOutput) -> None:
        self.out = out
        self.calls = 0

    async def prefill(self, rid: str, prompt: Any, params: SamplingParams) -> PrefillOutput:
        self.calls += 1
        return self.out


def test_in_process_prefill_hands_the_ticket_to_the_keeper() -> None:
    keeper = _Keeper()
    lease = KVLease(None, keeper=keeper)
    target = _Remote(PrefillOutput("r", prompt_tokens=3, first_token_id=-1,
                                   kv=_ticket("r"), first_token_pending=True))
    call = Prefill(target)

    async def scenario() -> PrefillOutput:
        out = await call("r", "a b c", SamplingParams(max_tokens=4), lease)
        await asyncio.sleep(0.01)
        return out

    assert call.in_process
    out = asyncio.run(scenario())
    assert out.kv is not None and keeper.calls == [("hold_many", ["r"])]


def test_in_process_prefill_passes_a_400_on_and_holds_nothing() -> None:
    keeper = _Keeper()
    target = _Remote(PrefillOutput("r", error="prompt: this model's maximum context "
                                   "length is 8 tokens", error_status=400))

    async def scenario() -> GenerateError:
        try:
            await Prefill(target)("r", "a b c", SamplingParams(max_tokens=9),
                                  KVLease(None, keeper=keeper))
        except GenerateError as exc:
            return exc
        raise AssertionError("no error")

    exc = asyncio.run(scenario())
    assert (exc.status, exc.type) == (400, "invalid_request_error")
    assert "maximum context length" in exc.message
    assert target.calls == 1 and keeper.calls == []
