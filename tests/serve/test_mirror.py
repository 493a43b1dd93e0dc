"""The scheduler's bookkeeping under any interleaving (no Ray): no slot ever leaks.

:class:`SchedulerCore` (pool, admission table, mirror with its in-flight entries) talks
to fake decode replicas made of the real parts, a :class:`ReplicaBook` and the emulated
engine, through message queues that hypothesis delivers in any order: dispatches,
answers (taken, refused, failed pulls), steps, reports (in order per replica, as Ray
delivers one caller's calls), cancellations by the owner (whose KV release makes a later
pull fail), replica deaths and replacements. Afterwards everything is drained: every
request finishes or is given up, and then every slot is free, nothing is in flight, the
pool and the admission table are empty, and no replica broke its reporting promise.

This is issue 12's slot leak: before, an admission answered True whose pull failed (or
whose install failed, or which was aborted before a report showed it) stayed in flight
for ever and was re-added to the mirror after every report, a phantom running request.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import build_policy
from br_serve.core.step import StepModel
from br_serve.engine.base import SamplingParams
from br_serve.engine.emulated import EmulatedEngine
from br_serve.serve.replica.book import ReplicaBook, ReportClock, as_delta, build_report
from br_serve.serve.scheduler.core import Dispatch, SchedulerCore
from br_serve.serve.wire.messages import Admission, AdmitReply, ReplicaReport
from br_serve.transport.base import KVHandle

SLOTS = 2


@dataclass
class FakeReplica:
    """One decode replica incarnation: the actor's logic, minus threads and Ray."""

    index: int
    incarnation: str
    book: ReplicaBook = field(default_factory=lambda: ReplicaBook(SLOTS))
    engine: EmulatedEngine = field(default_factory=lambda: EmulatedEngine(
        kv_bytes_per_token=1, step=StepModel(b_s=0.0), sleep=lambda s: None))
    step: int = 0
    pulling: dict[str, Admission] = field(default_factory=dict)
    clock: ReportClock = field(default_factory=lambda: ReportClock(0, full_every=5))
    # what build_report reads of a barrier generation (this fake has none)
    generation: int = 1
    members: tuple[int, ...] = ()

    @property
    def steps(self) -> int:
        return self.step

    def accept(self, item: Admission) -> AdmitReply | None:
        """``admit`` up to the pull: an answer now, or None (pull in progress)."""
        status = self.book.accept(item.request_id, item.owner)
        if status != "queued":
            return AdmitReply(status, self.step, self.incarnation)
        self.pulling[item.request_id] = item
        return None

    def finish_pull(self, rid: str, ok: bool) -> AdmitReply:
        item = self.pulling.pop(rid)
        if not ok:
            self.book.pull_failed(rid)
            return AdmitReply("failed", self.step, self.incarnation)
        self.book.pulled(item, bytes(item.prompt_tokens))
        return AdmitReply("queued", self.step, self.incarnation)

    def run_step(self) -> ReplicaReport | None:
        """One step as the decode replica runs it; its report if it sends one (a delta
        with news, else its periodic full state, else nothing)."""
        installs, aborts = self.book.take_work()
        for rid in aborts:
            self.engine.abort(rid)
        for a, kv in installs:
            self.engine.admit(a.request_id, kv, a.prompt_tokens, a.first_token_id, a.params)
        self.book.route(self.engine.step())
        fin, drop, started = self.book.take_report()
        send, full = self.clock.decide(news=bool(fin or drop or started),
                                       barrier_step=self.step + 1, now_s=0.0)
        self.step += 1
        rep = build_report(self.index, self.incarnation, self.engine, self.step, self,
                           None, fin, drop, started)
        if not send:
            return None
        self.clock.sent(True, 0.0)
        return rep if full else as_delta(rep, started)


class World:
    """The core, G fake replicas and the messages between them."""

    def __init__(self, replicas: int, policy: str) -> None:
        pol = build_policy(policy)
        self.core = SchedulerCore(replicas, SLOTS, pool_capacity=6,
                                  step_model=StepModel(0.0, 0.01, 0.0), policy=pol,
                                  detail=pol.needs.running_detail,
                                  clock=iter(range(10**9)).__next__)
        self.replicas = [FakeReplica(g, f"i{g}.0") for g in range(replicas)]
        for g, r in enumerate(self.replicas):
            self.core.mark_alive(g, r.incarnation)
        self.calls: list[tuple[str, Dispatch]] = []  # (incarnation, dispatch)
        self.pulls: list[tuple[str, Dispatch]] = []
        self.replies: list[tuple[Dispatch, AdmitReply | None]] = []
        self.reports: dict[int, collections.deque[ReplicaReport]] = collections.defaultdict(
            collections.deque)
        self.cancelled: set[str] = set()
        self.live: set[str] = set()  # submitted, neither finished nor given up
        self.n = 0

    # -- events ---------------------------------------------------------------------
    def submit(self, k: int) -> None:
        rid = f"r{self.n}"
        self.n += 1
        params = SamplingParams(max_tokens=2 + k % 4, seed=k)
        kv = KVHandle("fake", rid, 1 + k % 5)
        if self.core.submit(Admission(rid, "owner", 1 + k % 5, 0, params, kv)) == "queued":
            self.live.add(rid)

    def tick(self) -> None:
        for d in self.core.tick():
            self.calls.append((self.replicas[d.replica].incarnation, d))

    def deliver_call(self, k: int) -> None:
        inc, d = self.calls.pop(k % len(self.calls))
        rep = self.replicas[d.replica]
        if rep.incarnation != inc:  # the actor it was sent to is dead: the call fails
            self.replies.append((d, None))
            return
        reply = rep.accept(d.admission)
        if reply is None:
            self.pulls.append((inc, d))
        else:
            self.replies.append((d, reply))

    def deliver_pull(self, k: int, ok: bool) -> None:
        inc, d = self.pulls.pop(k % len(self.pulls))
        rep = self.replicas[d.replica]
        rid = d.admission.request_id
        if rep.incarnation != inc:
            self.replies.append((d, None))
            return
        # a cancelled request's KV was released by its owner: the pull fails
        reply = rep.finish_pull(rid, ok and rid not in self.cancelled)
        self.replies.append((d, reply))
        if reply.status == "failed":
            self.live.discard(rid)  # its owner re-prefills it under a new id

    def deliver_reply(self, k: int) -> None:
        d, reply = self.replies.pop(k % len(self.replies))
        self.core.answered(d, reply)

    def step(self, k: int) -> None:
        rep = self.replicas[k % len(self.replicas)]
        report = rep.run_step()
        if report is not None:  # news is always sent
            self.live -= set(report.finished_ids) | set(report.dropped_ids)
            self.reports[rep.index].append(report)

    def deliver_report(self, k: int) -> None:
        queues = [q for q in self.reports.values() if q]
        rep = queues[k % len(queues)].popleft()
        self.core.on_report(rep)

    def cancel(self, k: int) -> None:
        live = sorted(self.live)
        rid = live[k % len(live)]
        self.cancelled.add(rid)
        self.live.discard(rid)
        self.core.cancel(rid)
        for r in self.replicas:
            r.book.abort(rid)

    def kill(self, k: int) -> None:
        """Replica g dies and is replaced by a new, empty instance."""
        g = k % len(self.replicas)
        old = self.replicas[g]
        self.live -= set(old.book._state)  # lost with it: their owners re-prefill
        self.reports[g].clear()
        for rid in self.core.mark_dead(g):
            self.live.discard(rid)
        new = FakeReplica(g, f"i{g}.{self.n}")
        self.n += 1
        self.replicas[g] = new
        self.core.mark_alive(g, new.incarnation)

    # -- one drawn operation (the hypothesis tests' interleavings) --------------------
    def apply(self, op: str, k: int) -> None:
        """Do ``op`` (one of :data:`OPS`) with the drawn number ``k``; an op with nothing
        to act on (no call in flight, ...) does nothing."""
        if op == "submit":
            self.submit(k)
        elif op == "tick":
            self.tick()
        elif op == "call" and self.calls:
            self.deliver_call(k)
        elif op in ("pull_ok", "pull_fail") and self.pulls:
            self.deliver_pull(k, ok=op == "pull_ok")
        elif op == "reply" and self.replies:
            self.deliver_reply(k)
        elif op == "step":
            self.step(k)
        elif op == "report" and any(self.reports.values()):
            self.deliver_report(k)
        elif op == "cancel" and self.live:
            self.cancel(k)
        elif op == "kill" and k % 4 == 0:
            self.kill(k)

    # -- end ------------------------------------------------------------------------
    def drain(self) -> None:
        for _ in range(200):
            if not (self.calls or self.pulls or self.replies or len(self.core.pool)
                    or any(self.reports.values()) or self.core.mirror.inflight_count()
                    or any(r.book.taken() for r in self.replicas)):
                return
            self.tick()
            while self.calls or self.pulls or self.replies:
                if self.calls:
                    self.deliver_call(0)
                elif self.pulls:
                    self.deliver_pull(0, ok=True)
                else:
                    self.deliver_reply(0)
            for g in range(len(self.replicas)):
                self.step(g)
            while any(self.reports.values()):
                self.deliver_report(0)
        raise AssertionError("did not drain in 200 rounds")


OPS = ["submit", "tick", "call", "pull_ok", "pull_fail", "reply", "step", "report",
       "cancel", "kill"]


@pytest.mark.parametrize("policy", ["br0", "jsq"])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), max_size=150),
       replicas=st.integers(1, 3))
def test_every_slot_is_free_after_everything_finishes(policy: str, replicas: int,
                                                      ops: list[tuple[str, int]]) -> None:
    w = World(replicas, policy)
    for op, k in ops:
        w.apply(op, k)
    w.drain()
    core = w.core
    assert core.mirror.state.running_requests().sum() == 0, core.state()
    assert core.mirror.state.free_slots().tolist() == [SLOTS] * replicas
    assert core.mirror.inflight_count() == 0
    assert len(core.pool) == 0 and core.admissions == {}
    assert core.mirror.expired == 0  # no replica broke its promise
    assert not core.mirror._requests
    assert w.live == set()


def test_refused_dispatch_keeps_its_fcfs_position() -> None:
    """A request a full replica refused goes back ahead of the ones that came after it."""
    w = World(1, "jsq")
    for k in range(4):
        w.submit(k)
    w.tick()  # r0, r1 dispatched (2 slots); r2, r3 wait
    assert [d.admission.request_id for _, d in w.calls] == ["r0", "r1"]
    refused = AdmitReply("full", 0, "i0.0")
    assert w.core.answered(w.calls[1][1], refused)  # back in the pool
    assert [r.request_id for r in w.core.pool.fcfs()] == ["r1", "r2", "r3"]


def test_taken_request_missing_from_later_reports_expires() -> None:
    """The safety net: a replica that took a request and then never mentions it (a
    broken promise) cannot hold the slot for ever."""
    w = World(1, "jsq")
    w.submit(0)
    w.tick()
    _inc, d = w.calls.pop()
    w.core.answered(d, AdmitReply("queued", 5, "i0.0"))
    assert w.core.mirror.state.running_requests()[0] == 1
    report: Any = w.replicas[0].run_step()  # a full report of step 1 (nothing running)
    for step in (6, 7):
        w.core.on_report(_with(report, step=step))
    assert w.core.mirror.state.running_requests()[0] == 0
    assert w.core.mirror.expired == 1


def _with(rep: ReplicaReport, **kw: Any) -> ReplicaReport:
    import dataclasses

    return dataclasses.replace(rep, **kw)


class _Group:
    """Lock-step replicas as one barrier generation: every step all of them step, rank 0
    reports the barrier rows, the others only their news or periodic full state."""

    generation = 1

    def __init__(self, g: int) -> None:
        self.members = tuple(range(g))
        self.steps = 0
        self.replicas = [FakeReplica(i, f"i{i}") for i in range(g)]

    def step_all(self) -> list[ReplicaReport]:
        import numpy as np

        rows, pending = [], []
        for r in self.replicas:  # what each step computed with, before stepping
            rows.append((r.engine.load_tokens(), r.engine.running(), 0))
        self.steps += 1
        out = []
        for r in self.replicas:
            installs, _ = r.book.take_work()  # nothing is aborted here
            for a, kv in installs:
                r.engine.admit(a.request_id, kv, a.prompt_tokens, a.first_token_id, a.params)
            r.book.route(r.engine.step())
            fin, drop, started = r.book.take_report()
            send, full = r.clock.decide(news=bool(fin or drop or started),
                                        barrier_step=self.steps, now_s=0.0)
            r.step += 1
            pending.append((r, fin, drop, started, send, full))
        mat = np.array([(ld, n, int(p[4])) for (ld, n, _), p in zip(rows, pending,
                                                                    strict=True)])
        for r, fin, drop, started, send, full in pending:
            rank0 = r.index == 0
            rep = build_report(r.index, r.incarnation, r.engine, r.step, self,
                               mat if rank0 else None, fin, drop, started)
            if send or (rank0 and mat[:, 1].any()):
                r.clock.sent(True, 0.0)
                out.append(rep if full else as_delta(rep, started))
        return out


@settings(max_examples=60, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000)), min_size=1,
                     max_size=60))
def test_self_advancing_mirror_matches_the_replicas(plan: list[tuple[int, int]]) -> None:
    """Rows advance one token per step from rank 0's reports alone; deltas and periodic
    full states arrive in any order across replicas (in order per replica): once all
    are in, the mirror's loads and running counts are the engines'."""
    import random

    grp = _Group(3)
    core = SchedulerCore(3, SLOTS, 8, StepModel(0.0, 0.01, 0.0), build_policy("jsq"), detail=True,
                         clock=iter(range(10**9)).__next__)
    for r in grp.replicas:
        core.mark_alive(r.index, r.incarnation)
    core.members.begin(grp.members)
    grp.generation = core.members.generation
    queues: dict[int, collections.deque[ReplicaReport]] = collections.defaultdict(
        collections.deque)
    n = 0
    for submits, k in plan:
        rng = random.Random(k)
        for _ in range(submits):
            params = SamplingParams(max_tokens=2 + rng.randrange(12), seed=n)
            p = 1 + rng.randrange(9)
            core.submit(Admission(f"q{n}", "o", p, 0, params, KVHandle("fake", f"q{n}", p)))
            n += 1
        for d in core.tick():
            r = grp.replicas[d.replica]
            assert r.accept(d.admission) is None
            core.answered(d, r.finish_pull(d.admission.request_id, True))
        for rep in grp.step_all():
            queues[rep.replica].append(rep)
        while any(queues.values()) and rng.random() < 0.7:  # deliver some, in any order
            q = rng.choice([q for q in queues.values() if q])
            core.on_report(q.popleft())
    while any(queues.values()):
        core.on_report(next(q for q in queues.values() if q).popleft())
    st_ = core.mirror.state
    assert st_.load_tokens().tolist() == [r.engine.load_tokens() for r in grp.replicas]
    assert st_.running_requests().tolist() == [r.engine.running() for r in grp.replicas]
