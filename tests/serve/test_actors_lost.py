"""The ingress when the graph's actors die with their owner (the ``Actors`` replica), no
Ray: fake handles, a fake owner whose ``resolve`` hangs while it is down and then
answers a new epoch.

What an operator expects, checked here: a stream in flight ends promptly with an
explicit error (no hang, no wait for a dead scheduler's 60 s), a new request is refused
with 503 naming the cause while the actors are gone, and once the owner answers again
the Streamer adopts the new actors (scheduler, decode replicas, keeper) and serves.
A scheduler that is only restarting (the owner answers with the same epoch) changes
nothing. ``tests/serve/test_faults_ray.py`` kills the real replica. The fakes are not
Ray actors, so the GCS cannot say whether they live, and a silent owner is taken for
gone. ``tests/serve/test_slow_actors.py`` fakes the GCS for the slow-owner cases.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from br_serve.engine.base import SamplingParams
from br_serve.serve.actors import GraphActors
from br_serve.serve.config import parse_graph_config
from br_serve.serve.frontend import events
from br_serve.serve.frontend import owner as watch
from br_serve.serve.frontend.streams import GenerateError, Streamer
from br_serve.serve.wire.messages import Admitted
from br_serve.transport.lease import KVLease
from tests.serve.test_streamer import FakeActor, _prefill


class _Poll:
    def __init__(self, replica: FakeDecode) -> None:
        self.replica = replica

    def remote(self, *args: Any) -> Any:
        return self.replica.poll_once()


class FakeDecode(FakeActor):
    """A decode replica whose polls answer what the test pushed (every 20 ms), or fail
    once dead."""

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.dead = False
        super().__init__(abort=None)

    def __getattr__(self, name: str) -> Any:
        if name == "poll":
            return _Poll(self)
        return super().__getattr__(name)

    async def poll_once(self) -> list[Any]:
        await asyncio.sleep(0.02)
        if self.dead:
            raise ActorDiedError()
        out = list(self.pending)
        self.pending.clear()
        return out

    def run(self, rid: str, g: int, tokens: range, last: int) -> None:
        """Admit ``rid`` here and produce tokens ``tokens`` (engine indexes)."""
        self.pending.append(Admitted(rid, g))
        self.pending += [(rid, 100 + i, f"t{i}", i, i == last, "length" if i == last else None)
                         for i in tokens]


class FakeOwner:
    """``resolve`` / ``replace`` of the Actors deployment: hangs while down."""

    def __init__(self, actors: GraphActors) -> None:
        self.actors = actors
        self.up = asyncio.Event()
        self.up.set()
        self.calls = 0

    async def resolve(self) -> GraphActors:
        self.calls += 1
        await self.up.wait()  # Serve queues the call while its replica restarts
        return self.actors

    async def replace(self, g: int, old: Any) -> tuple[Any, str]:
        await self.up.wait()
        return self.actors.decode[g], self.actors.epoch


def _actors(epoch: str) -> GraphActors:
    sched = FakeActor(submit="queued", summary=None, cancel=None, replica_lost=None,
                      replica_replaced=None, locate=("queued", -1))
    return GraphActors(sched, [FakeDecode(), FakeDecode()], FakeActor(release=None), epoch)


def _streamer(owner: FakeOwner) -> Streamer:
    a = owner.actors
    conf = parse_graph_config(replicas=2, transport="objref")
    return Streamer(conf, _prefill("objref"), a.scheduler, a.decode,
                    KVLease(None, keeper=a.keeper), owner.replace, resolve=owner.resolve,
                    epoch=a.epoch)


async def _collect(s: Streamer, n: int) -> list[Any]:
    return [t async for t in s.generate("a b c", SamplingParams(max_tokens=n, seed=1))]


async def _until(pred: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _ends_exactly_on_the_same_actors(s: Streamer, a: GraphActors, rid: str,
                                           stream: Any) -> None:
    """Decode replica 0 finishes ``rid`` (3 tokens after the first): the stream ends
    exact, and the Streamer still serves with the same actors, none taken for lost."""
    a.decode[0].run(rid, 0, range(1, 4), last=3)
    toks = await asyncio.wait_for(stream, 5)
    assert [t.index for t in toks] == [0, 1, 2, 3] and toks[-1].error is None
    assert not s._actors_down and s._scheduler is a.scheduler


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "_RESOLVE_S", 0.3)
    monkeypatch.setattr(events, "_WATCH_S", 0.05)


def test_lost_actors_end_streams_refuse_new_ones_and_the_new_actors_serve() -> None:
    async def go() -> None:
        old = _actors("e1")
        owner = FakeOwner(old)
        s = _streamer(owner)
        stream = asyncio.ensure_future(_collect(s, 10))
        rid = f"{s.owner}-1"
        await _until(lambda: old.scheduler.called("submit"), 5)
        old.decode[0].run(rid, 0, range(1, 3), last=9)  # tokens 1, 2 of 9
        await asyncio.sleep(0.2)
        # the Actors replica dies: every actor with it; the owner does not answer
        owner.up.clear()
        old.scheduler.answers["summary"] = ActorDiedError()
        old.scheduler.answers["submit"] = ActorDiedError()
        for d in old.decode:
            d.dead = True
        t0 = time.monotonic()
        toks = await asyncio.wait_for(stream, 5)
        assert time.monotonic() - t0 < 3  # promptly, not after the 60 s scheduler retry
        assert [t.index for t in toks] == [0, 1, 2, 3]
        assert toks[-1].finish_reason == "error" and watch.ACTORS_LOST in (toks[-1].error or "")
        assert [t.token_id for t in toks[1:3]] == [101, 102]  # a correct prefix
        with pytest.raises(GenerateError) as err:
            await _collect(s, 3)
        assert err.value.status == 503 and err.value.message == watch.ACTORS_LOST
        assert not s.gate.inside  # refused before the gate let it in
        # Serve restarted the owner, which made new actors
        new = _actors("e2")
        owner.actors = new
        owner.up.set()
        await _until(lambda: not s._actors_down and s._scheduler is new.scheduler, 5)
        assert s._decode == new.decode and s._epoch == "e2"
        stream = asyncio.ensure_future(_collect(s, 3))
        await _until(lambda: new.scheduler.called("submit"), 5)
        (sub,) = new.scheduler.called("submit")  # nothing of the old pool resubmitted
        rid2 = sub[0].request_id
        new.decode[1].run(rid2, 1, range(1, 3), last=2)
        toks = await asyncio.wait_for(stream, 5)
        assert [(t.index, t.token_id) for t in toks[1:]] == [(1, 101), (2, 102)]
        assert toks[-1].finished and toks[-1].error is None
        await s.close()

    asyncio.run(go())


def test_a_restarting_scheduler_under_the_same_owner_ends_nothing() -> None:
    async def go() -> None:
        a = _actors("e1")
        owner = FakeOwner(a)
        s = _streamer(owner)
        stream = asyncio.ensure_future(_collect(s, 4))
        rid = f"{s.owner}-1"
        await _until(lambda: a.scheduler.called("submit"), 5)
        a.scheduler.answers["summary"] = ActorDiedError()  # restarting in place
        await _until(lambda: owner.calls > 0, 5)  # the Streamer asked the owner
        a.scheduler.answers["summary"] = None
        await _ends_exactly_on_the_same_actors(s, a, rid, stream)
        await s.close()

    asyncio.run(go())


def test_a_replacement_from_a_new_owner_makes_the_streamer_adopt_its_actors() -> None:
    async def go() -> None:
        old = _actors("e1")
        owner = FakeOwner(old)
        s = _streamer(owner)
        await _collect_one(s, old)
        # the owner was restarted between two watches: a poll fails first, and the
        # replacement comes from a new owner (another epoch)
        new = _actors("e2")
        owner.actors = new
        old.decode[0].dead = True
        await _until(lambda: s._epoch == "e2", 5)
        assert s._scheduler is new.scheduler and s._decode == new.decode
        await _collect_one(s, new)
        await s.close()

    asyncio.run(go())


async def _collect_one(s: Streamer, a: GraphActors) -> None:
    n = len(a.scheduler.called("submit"))
    stream = asyncio.ensure_future(_collect(s, 2))
    await _until(lambda: len(a.scheduler.called("submit")) > n, 5)
    rid = a.scheduler.called("submit")[-1][0].request_id
    a.decode[0].run(rid, 0, range(1, 2), last=1)
    toks = await asyncio.wait_for(stream, 5)
    assert [t.index for t in toks] == [0, 1] and toks[-1].error is None
