"""Slow is not dead, the scheduler's side: a decode replica whose ping (or report) is
late while its process lives is waited for, not killed. No Ray: fake replica handles,
a fake GCS that says which actors live, and ``ray.kill`` recorded.

What an operator expects, checked here. A replica that answers its ping only after the
scheduler's first bound (``PING_S``), while the GCS has it ALIVE, keeps its place: it
is not killed, not marked dead (its requests are not re-prefilled, no replacement is
built), and it is a member of the generation formed next; a restarted scheduler adopts
the running generation although that replica's ping and report were late. The bounds
still hold: a replica the GCS has DEAD, or about which it cannot say (None), is dead at
the first bound as before; one Ray reports gone is dead at once; one alive per the GCS
that never answers is dead after ``PING_MAX_S``.

Before: any ping past ``PING_S`` (3 s) marked the replica dead and killed it
(``ray.kill(no_restart=True)``), and a live replica stalled on a loaded host was lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import ray
from ray.exceptions import ActorDiedError

from br_serve.serve.config import parse_graph_config
from br_serve.serve.scheduler import io
from br_serve.serve.scheduler.actor import Scheduler
from br_serve.serve.wire.messages import ReplicaReport

#: the first bound and the hard one, small so that the module runs in seconds
PING = 0.1
PING_MAX = 1.0
#: a late replica answers this long after the scheduler first asked the GCS about it,
#: i.e. only once the scheduler's first bound has passed, whatever that bound is
LATE_S = 0.3


class _Method:
    def __init__(self, fn: Callable[..., Coroutine[Any, Any, Any]]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Coroutine[Any, Any, Any]:
        return self.fn(*args)


class FakeReplica:
    """A decode replica's handle: ``ping``, ``report``, ``open_store``, ``join``. It can
    be dead (Ray fails every call at once), late (it answers ``LATE_S`` after the GCS
    was asked about it) or hung (it never answers)."""

    def __init__(self, g: int, generation: int = 0, members: tuple[int, ...] = ()) -> None:
        self.g, self.generation, self.members = g, generation, members
        self.dead = False
        self.late = False
        self.awake = asyncio.Event()
        self.awake.set()
        self.calls: list[str] = []
        self.ping = _Method(self._ping)
        self.report = _Method(self._report)
        self.open_store = _Method(self._open_store)
        self.join = _Method(self._join)

    def hang(self, late: bool) -> None:
        self.awake.clear()
        self.late = late

    def asked(self) -> None:
        """The GCS was asked about this actor (by the fake GCS)."""
        if self.late:
            asyncio.get_running_loop().call_later(LATE_S, self.awake.set)

    async def _answer(self, method: str) -> None:
        self.calls.append(method)
        if self.dead:
            raise ActorDiedError()
        await self.awake.wait()

    async def _ping(self) -> tuple[int, int, str]:
        await self._answer("ping")
        return self.g, self.generation, f"i{self.g}"

    async def _report(self) -> ReplicaReport:
        await self._answer("report")
        return ReplicaReport(replica=self.g, generation=self.generation, step=7,
                             load_tokens=0, running_ids=(), prompt_tokens=(),
                             decoded_tokens=(), finished_ids=(), finished_output_tokens=(),
                             members=self.members, barrier_loads=(), barrier_running=(),
                             compute_s=0.0, barrier_s=0.0, incarnation=f"i{self.g}")

    async def _open_store(self, generation: int) -> int:
        await self._answer("open_store")
        return 1234

    async def _join(self, generation: int, rank: int, members: tuple[int, ...],
                    port: int) -> bool:
        await self._answer("join")
        self.generation, self.members = generation, members
        return True


class FakeGCS:
    """The GCS's actor table: every actor ALIVE unless ``states`` says otherwise."""

    def __init__(self) -> None:
        self.states: dict[int, str | None] = {}
        self.asked: list[int] = []

    async def __call__(self, handle: FakeReplica) -> str | None:
        self.asked.append(handle.g)
        handle.asked()
        return self.states.get(handle.g, "ALIVE")


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The replicas ``ray.kill`` was called on; the bounds made small."""
    out: list[int] = []
    monkeypatch.setattr(ray, "kill", lambda h, no_restart=True: out.append(h.g))
    monkeypatch.setattr(io, "PING_S", PING)
    monkeypatch.setattr(io, "PING_MAX_S", PING_MAX)
    return out


def _scheduler(replicas: list[FakeReplica], gcs: FakeGCS) -> Scheduler:
    """A scheduler whose replicas all answered once (alive, no generation yet)."""
    sch = Scheduler(parse_graph_config(replicas=len(replicas)),
                    [f"d{g}" for g in range(len(replicas))])
    sch.decode = list(replicas)
    sch._actor_state = gcs
    sch._group_lock = asyncio.Lock()
    sch._wake = asyncio.Event()
    for g in range(len(replicas)):
        sch.core.mark_alive(g, f"i{g}")
    return sch


def _alive(sch: Scheduler) -> list[bool]:
    return [bool(a) for a in sch.core.mirror.alive()]


async def _reform_with_replica_1_hung(late: bool) -> tuple[Scheduler, FakeGCS, float]:
    """A re-formation of two replicas, replica 1 hung (``late``: it answers once the GCS
    was asked about it); the scheduler, the fake GCS and the seconds it took."""
    reps = [FakeReplica(0), FakeReplica(1)]
    gcs = FakeGCS()
    sch = _scheduler(reps, gcs)
    reps[1].hang(late=late)
    t0 = time.monotonic()
    await sch._reform()
    return sch, gcs, time.monotonic() - t0


def test_a_live_replica_whose_ping_is_late_is_kept(kills: list[int],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A barrier failure makes the scheduler ping every replica; replica 1 answers only
    after the first bound, alive per the GCS: it stays, in the next generation."""
    with caplog.at_level(logging.WARNING):
        sch, gcs, took = asyncio.run(_reform_with_replica_1_hung(late=True))
    assert kills == []
    assert _alive(sch) == [True, True]
    assert sch.core.members.members == (0, 1)
    assert 1 in gcs.asked and 0 not in gcs.asked  # only the late one was looked up
    assert took < PING_MAX  # it answered, so nobody waited for the hard bound
    assert "scheduler: decode replica 1 slow: no ping answer in" in caplog.text
    assert "alive per the GCS" in caplog.text


def test_a_restarted_scheduler_adopts_the_generation_despite_a_late_replica(
        kills: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Bootstrap: both replicas run generation 3; replica 1's ping and report are late
    but it is alive. The scheduler adopts generation 3 (no new one formed, no rank
    stalled to rejoin) with both members, and its mirror has both reports."""
    monkeypatch.setattr(io, "START_S", PING)  # the constructors' bound, made small too

    async def go() -> tuple[Scheduler, list[FakeReplica]]:
        reps = [FakeReplica(g, 3, (0, 1)) for g in (0, 1)]
        sch = Scheduler(parse_graph_config(replicas=2), ["d0", "d1"])
        sch._actor_state = FakeGCS()

        async def lookup(wait_s: float) -> list[Any]:
            return list(reps)

        async def no_channel() -> None:
            return None

        monkeypatch.setattr(sch, "_lookup", lookup)
        monkeypatch.setattr(sch, "_open_report_channel", no_channel)
        reps[1].hang(late=True)
        await sch._bootstrap()
        reps[1].hang(late=True)  # its report is late too
        assert await sch._report_of(1) is not None
        return sch, reps

    sch, reps = asyncio.run(go())
    assert kills == []
    assert _alive(sch) == [True, True]
    assert (sch.core.members.generation, sch.core.members.members) == (3, (0, 1))
    assert "join" not in reps[0].calls + reps[1].calls
    assert sch.reports_by_path["pull"] == 3


@pytest.mark.parametrize("state", ["DEAD", None])
def test_a_replica_dead_or_unknown_to_the_gcs_is_dead_at_the_first_bound(
        kills: list[int], state: str | None) -> None:
    """As before the fix: no answer within ``PING_S`` and the GCS does not have it
    ALIVE (DEAD, or it cannot say): dead and killed, and the survivor forms a group."""
    async def go() -> tuple[Scheduler, float]:
        reps = [FakeReplica(0), FakeReplica(1)]
        gcs = FakeGCS()
        gcs.states[1] = state
        sch = _scheduler(reps, gcs)
        reps[1].hang(late=False)
        t0 = time.monotonic()
        await sch._reform()
        return sch, time.monotonic() - t0

    sch, took = asyncio.run(go())
    assert kills == [1]
    assert _alive(sch) == [True, False]
    assert sch.core.members.members == (0,)
    assert took < PING_MAX / 2  # the first bound, not the hard one


def test_a_replica_ray_reports_gone_is_dead_at_once(kills: list[int]) -> None:
    async def go() -> tuple[Scheduler, FakeGCS, float]:
        reps = [FakeReplica(0), FakeReplica(1)]
        gcs = FakeGCS()
        sch = _scheduler(reps, gcs)
        reps[1].dead = True
        t0 = time.monotonic()
        await sch._reform()
        return sch, gcs, time.monotonic() - t0

    sch, gcs, took = asyncio.run(go())
    assert kills == [1] and _alive(sch) == [True, False]
    assert sch.core.members.members == (0,)
    assert gcs.asked == [] and took < PING


def test_a_live_replica_that_never_answers_is_dead_after_the_hard_bound(
        kills: list[int], caplog: pytest.LogCaptureFixture) -> None:
    """Alive per the GCS but hung: waited for (with warnings), then killed at
    ``PING_MAX_S``, so a hung member does not stall the lock-step group for long."""
    with caplog.at_level(logging.WARNING):
        sch, gcs, took = asyncio.run(_reform_with_replica_1_hung(late=False))
    assert kills == [1] and _alive(sch) == [True, False]
    assert sch.core.members.members == (0,)
    assert gcs.asked.count(1) >= 2  # checked again while waiting
    assert PING_MAX <= took < PING_MAX + 1.5
    assert "decode replica 1 slow: no ping answer" in caplog.text
