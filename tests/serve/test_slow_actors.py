"""Slow is not dead: the ingress against actors that are late but alive, no Ray (fake
handles, and a fake GCS that says which actors live).

What an operator expects, checked here. A decode replica whose poll stalls past its
bound while its process lives keeps its streams: nothing is re-prefilled, the scheduler
is not told, and the replica is not replaced. An owner (the ``Actors`` replica) that is
slow to answer while its scheduler lives ends no stream and refuses no request.
The hard bounds hold too: a live replica that never answers is lost after
``_POLL_MAX_S``, and a dead one as soon as the GCS says so, after ``_POLL_S`` as before.

Before: any poll past ``_POLL_S`` (15 s) replaced the replica and re-prefilled its
streams, and any owner slower than ``_RESOLVE_S`` (5 s) ended every stream in flight
with the ACTORS_LOST error and answered new requests with 503 until it replied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from br_serve.serve.actors import GraphActors
from br_serve.serve.config import parse_graph_config
from br_serve.serve.frontend import events
from br_serve.serve.frontend import owner as watch
from br_serve.serve.frontend.streams import Streamer
from br_serve.serve.wire import liveness
from br_serve.transport.lease import KVLease
from tests.serve.test_actors_lost import (
    FakeDecode,
    FakeOwner,
    _actors,
    _collect,
    _ends_exactly_on_the_same_actors,
    _until,
)
from tests.serve.test_streamer import FakeActor, _prefill


class FakeGCS:
    """The GCS's actor table: every actor ALIVE unless ``states`` says otherwise."""

    def __init__(self) -> None:
        self.states: dict[int, str | None] = {}
        self.asked: list[Any] = []

    async def __call__(self, handle: Any) -> str | None:
        self.asked.append(handle)
        return self.states.get(id(handle), liveness.ALIVE)

    def set(self, handle: Any, state: str | None) -> None:
        self.states[id(handle)] = state


class StallingDecode(FakeDecode):
    """A decode replica whose process can stall: while ``awake`` is clear its polls
    answer nothing; once set, the stalled poll answers with what came meanwhile."""

    def __init__(self) -> None:
        self.awake = asyncio.Event()
        self.awake.set()
        super().__init__()

    async def poll_once(self) -> list[Any]:
        await self.awake.wait()
        return await super().poll_once()

    def tokens(self, rid: str, tokens: range, last: int) -> None:
        self.pending += [(rid, 100 + i, f"t{i}", i, i == last, "length" if i == last else None)
                         for i in tokens]


class CountingOwner(FakeOwner):
    def __init__(self, actors: GraphActors) -> None:
        super().__init__(actors)
        self.replaced: list[int] = []

    async def replace(self, g: int, old: Any) -> tuple[Any, str]:
        self.replaced.append(g)
        return await super().replace(g, old)


def _world(epoch: str = "e1") -> tuple[GraphActors, CountingOwner, FakeGCS, Streamer]:
    base = _actors(epoch)
    a = GraphActors(base.scheduler, [StallingDecode(), StallingDecode()], base.keeper, epoch)
    owner = CountingOwner(a)
    gcs = FakeGCS()
    conf = parse_graph_config(replicas=2, transport="objref")
    s = Streamer(conf, _prefill("objref"), a.scheduler, a.decode,
                 KVLease(None, keeper=a.keeper), owner.replace, resolve=owner.resolve,
                 epoch=a.epoch, actor_state=gcs)
    return a, owner, gcs, s


async def _submitted(a: GraphActors, n: int) -> str:
    """The request id of the ``n``-th submit (1-based), once it came."""
    await _until(lambda: len(a.scheduler.called("submit")) >= n, 5)
    return str(a.scheduler.called("submit")[n - 1][0].request_id)


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "_POLL_S", 0.1)
    monkeypatch.setattr(events, "_POLL_MAX_S", 10.0)
    monkeypatch.setattr(events, "_WATCH_S", 0.05)
    monkeypatch.setattr(watch, "_RESOLVE_S", 0.3)


# -- a slow decode replica ----------------------------------------------------------
def test_a_stalled_decode_replica_that_lives_keeps_its_streams(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its poll answers 8 poll bounds late, with the tokens made meanwhile: the stream
    goes on where it was, prefilled once; the replica is neither reported nor
    replaced."""
    async def go() -> None:
        a, owner, gcs, s = _world()
        d0 = a.decode[0]
        assert isinstance(d0, StallingDecode)
        stream = asyncio.ensure_future(_collect(s, 6))
        rid = await _submitted(a, 1)
        d0.run(rid, 0, range(1, 3), last=5)  # tokens 1, 2 of 5
        await asyncio.sleep(0.2)
        d0.awake.clear()  # the host stops scheduling it
        d0.tokens(rid, range(3, 6), last=5)  # what its engine made before the stall
        await asyncio.sleep(0.8)
        # before: lost after 0.1 s, reported, replaced and re-prefilled
        assert a.scheduler.called("replica_lost") == [] and owner.replaced == []
        assert len(s.prefill.called("prefill")) == 1 and 0 not in s._dead
        assert gcs.asked.count(d0) >= 3  # the GCS was asked at each bound
        d0.awake.set()
        toks = await asyncio.wait_for(stream, 5)
        assert [(t.index, t.token_id) for t in toks] == [(0, 7)] + [(i, 100 + i)
                                                                    for i in range(1, 6)]
        assert toks[-1].finished and all(t.error is None for t in toks)
        assert s._decode[0] is d0 and a.scheduler.called("replica_lost") == []
        assert not s._actors_down and owner.calls == 0  # the owner was not even asked
        await s.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(go())
    assert "decode replica 0 slow: no poll answer in" in caplog.text
    assert "alive per the GCS" in caplog.text


def test_a_live_replica_that_never_answers_is_lost_after_the_hard_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GCS says ALIVE for ever, the poll never answers: lost at ``_POLL_MAX_S``,
    not before and not never; its stream re-prefills and finishes on replica 1."""
    monkeypatch.setattr(events, "_POLL_MAX_S", 0.5)

    async def go() -> None:
        a, owner, _gcs, s = _world()
        d0, d1 = a.decode
        assert isinstance(d0, StallingDecode)
        fresh = StallingDecode()  # what the owner replaces it with
        owner.actors = GraphActors(a.scheduler, [fresh, d1], a.keeper, a.epoch)
        stream = asyncio.ensure_future(_collect(s, 4))
        rid = await _submitted(a, 1)
        d0.run(rid, 0, range(1, 2), last=3)
        await asyncio.sleep(0.2)
        d0.awake.clear()
        t0 = time.monotonic()
        await _until(lambda: a.scheduler.called("replica_lost"), 5)
        took = time.monotonic() - t0
        assert 0.4 <= took < 2.0, took  # the bound, from the stalled poll's start
        assert a.scheduler.called("replica_lost") == [(0,)]
        rid2 = await _submitted(a, 2)  # re-prefilled with tokens 0, 1 done
        assert rid2 == f"{rid}.r1"
        d1.run(rid2, 1, range(1, 2), last=1)
        toks = await asyncio.wait_for(stream, 5)
        assert [t.index for t in toks] == [0, 1, 2, 3] and toks[-1].error is None
        await _until(lambda: s._decode[0] is fresh, 5)
        assert owner.replaced == [0]
        await s.close()

    asyncio.run(go())


@pytest.mark.parametrize("state", ["DEAD", None])
def test_a_silent_replica_the_gcs_does_not_have_alive_is_lost_at_the_first_bound(
        state: str | None) -> None:
    """No slower than before: DEAD per the GCS, or no word from it, after ``_POLL_S``."""
    async def go() -> None:
        a, _owner, gcs, s = _world()
        d0 = a.decode[0]
        assert isinstance(d0, StallingDecode)
        gcs.set(d0, state)
        s._ensure_started()
        await asyncio.sleep(0.1)
        d0.awake.clear()
        t0 = time.monotonic()
        await _until(lambda: a.scheduler.called("replica_lost"), 5)
        assert time.monotonic() - t0 < 1.0  # _POLL_S is 0.1, _POLL_MAX_S 10
        await s.close()

    asyncio.run(go())


# -- a slow owner -------------------------------------------------------------------
def test_a_slow_owner_whose_scheduler_lives_ends_no_stream_and_refuses_nothing() -> None:
    """Decode replica 1 really dies while the owner takes seconds to answer: its stream
    re-prefills on replica 0, the other stream goes on, a new request is served, and
    the replacement comes once the owner answers. Before: the owner's silence past
    ``_RESOLVE_S`` ended both streams with ACTORS_LOST and refused new requests."""
    async def go() -> None:
        a, owner, gcs, s = _world()
        d0, d1 = a.decode
        first = asyncio.ensure_future(_collect(s, 5))
        rid_a = await _submitted(a, 1)
        second = asyncio.ensure_future(_collect(s, 5))
        rid_b = await _submitted(a, 2)
        d0.run(rid_a, 0, range(1, 3), last=4)
        d1.run(rid_b, 1, range(1, 3), last=4)
        await asyncio.sleep(0.2)
        owner.up.clear()  # Serve's handle to the owner lags
        fresh = FakeDecode()
        owner.actors = GraphActors(a.scheduler, [d0, fresh], a.keeper, a.epoch)
        gcs.set(d1, "DEAD")
        d1.dead = True  # its polls now fail with ActorDiedError
        rid_b1 = await _submitted(a, 3)  # re-prefilled, tokens 0-2 done
        assert rid_b1 == f"{rid_b}.r1"
        assert owner.calls >= 1 and a.scheduler.called("replica_lost") == [(1,)]
        await asyncio.sleep(0.5)  # past _RESOLVE_S, the owner still silent
        assert not s._actors_down
        third = asyncio.ensure_future(_collect(s, 2))  # not a 503
        rid_c = await _submitted(a, 4)
        d0.tokens(rid_a, range(3, 5), last=4)
        d0.run(rid_b1, 0, range(1, 2), last=1)
        d0.run(rid_c, 0, range(1, 2), last=1)
        for fut, n in ((first, 5), (second, 5), (third, 2)):
            toks = await asyncio.wait_for(fut, 5)
            assert [t.index for t in toks] == list(range(n)), toks
            assert toks[-1].finished and all(t.error is None for t in toks), toks
        assert owner.replaced == [1] and s._decode[1] is d1  # waiting for the owner
        owner.up.set()
        await _until(lambda: s._decode[1] is fresh, 5)
        assert a.scheduler.called("replica_replaced") == [(1,)] and s._epoch == "e1"
        await s.close()

    asyncio.run(go())


def test_a_scheduler_restarting_under_a_slow_owner_ends_nothing() -> None:
    async def go() -> None:
        a, owner, gcs, s = _world()
        stream = asyncio.ensure_future(_collect(s, 4))
        rid = await _submitted(a, 1)
        owner.up.clear()
        gcs.set(a.scheduler, "RESTARTING")
        a.scheduler.answers["summary"] = ActorDiedError()  # restarting in place
        await _until(lambda: owner.calls > 0, 5)
        await asyncio.sleep(0.5)  # past _RESOLVE_S
        assert not s._actors_down
        a.scheduler.answers["summary"] = None
        gcs.set(a.scheduler, liveness.ALIVE)
        await _ends_exactly_on_the_same_actors(s, a, rid, stream)
        await s.close()

    asyncio.run(go())


def test_a_dead_owner_is_still_found_promptly() -> None:
    """The owner died: the GCS has its scheduler DEAD, so its silence means what it
    meant before: the stream ends with ACTORS_LOST, new requests get 503."""
    async def go() -> None:
        a, owner, gcs, s = _world()
        stream = asyncio.ensure_future(_collect(s, 6))
        rid = await _submitted(a, 1)
        a.decode[0].run(rid, 0, range(1, 2), last=5)
        await asyncio.sleep(0.2)
        owner.up.clear()
        for actor in (a.scheduler, *a.decode):
            gcs.set(actor, "DEAD")
        a.scheduler.answers["summary"] = ActorDiedError()
        for d in a.decode:
            d.dead = True
        t0 = time.monotonic()
        toks = await asyncio.wait_for(stream, 5)
        assert time.monotonic() - t0 < 2  # _RESOLVE_S (0.3) and one GCS lookup
        assert toks[-1].finish_reason == "error" and watch.ACTORS_LOST in (toks[-1].error or "")
        assert s._actors_down
        await s.close()

    asyncio.run(go())


def test_the_gcs_cannot_say_for_a_handle_that_is_not_a_ray_actor() -> None:
    assert asyncio.run(liveness.gcs_state(FakeActor())) is None
    assert asyncio.run(liveness.gcs_state(object())) is None
