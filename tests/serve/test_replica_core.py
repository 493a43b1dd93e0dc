"""The decode replica's decisions (:class:`ReplicaCore`) without Ray, threads or
sockets: admission into slots, aborts, installs, a step's events and failures, when and
what it reports, and what a report that could not be sent does to the next one.

The engine is the real emulated one (no sleeping); the barrier is a record of what a
generation is (rank, members, steps), and the exchange's rows are built by the test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from br_serve.core.step import StepModel
from br_serve.engine.base import SamplingParams
from br_serve.engine.emulated import EmulatedEngine
from br_serve.serve.replica.book import ReportClock
from br_serve.serve.replica.core import ReplicaCore, StepNews
from br_serve.serve.wire.messages import Admission, Admitted, ReplicaReport, StreamError
from br_serve.transport.base import KVHandle

OWNER = "ingress-a"


@dataclass
class Gen:
    """What the core reads of a barrier generation."""

    rank: int = 0
    members: tuple[int, ...] = (0,)
    generation: int = 1
    steps: int = 0


def _engine() -> EmulatedEngine:
    return EmulatedEngine(kv_bytes_per_token=1, step=StepModel(b_s=0.0), sleep=lambda s: None)


def _item(rid: str, prompt: int = 3, max_tokens: int = 4, owner: str = OWNER) -> Admission:
    return Admission(rid, owner, prompt, 7, SamplingParams(max_tokens=max_tokens, seed=1),
                     KVHandle("fake", rid, prompt))


def _admit(core: ReplicaCore, item: Admission) -> None:
    assert core.accept(item) is None
    taken, reply = core.pulled(item, bytes(item.prompt_tokens))
    assert taken and reply.status == "queued"


class Shell:
    """The actor's step, minus threads, Ray and the real barrier: what it calls on the
    core, in its order."""

    def __init__(self, core: ReplicaCore, gen: Gen | None = None) -> None:
        self.core = core
        self.engine = _engine()
        self.gen = gen or Gen()
        self.sent: list[ReplicaReport] = []
        self.delivered: dict[str, list[Any]] = {}
        self.send_ok = True
        self.failures: list[tuple[str, str, bool]] = []

    def step(self, others_running: int = 0, now_s: float = 0.0, fresh: bool = False,
             exchange_ok: bool = True) -> StepNews:
        installs, aborts = self.core.take_work()
        for rid in aborts:
            self.engine.abort(rid)
        for a, kv in installs:
            try:
                self.engine.admit(a.request_id, kv, a.prompt_tokens, a.first_token_id,
                                  a.params)
            except ValueError as exc:
                self._deliver(self.core.install_failed(a, str(exc)))
        load, running = self.engine.load_tokens(), self.engine.running()
        events = self.engine.step()
        failures, self.failures = self.failures, []
        news = self.core.after_step(events, failures, barrier_step=self.gen.steps + 1,
                                    now_s=now_s, fresh_channel=fresh)
        rows = None
        if exchange_ok:
            self.gen.steps += 1
            mine = [load, running, int(news.report), 0.01]
            rows = np.array([mine] + [[5, others_running, 0, 0.01]] * (len(
                self.gen.members) - 1), dtype=np.float64)
        self._deliver(news.events)
        self.core.count_step()
        rep = self.core.after_exchange(news, self.engine, self.gen, rows,
                                       compute_s=0.01, barrier_s=0.0)
        if rep is not None:
            if self.send_ok:
                self.sent.append(rep)
            self.core.report_sent(news, self.send_ok, now_s)
        return news

    def _deliver(self, out: dict[str, list[Any]]) -> None:
        for owner, evs in out.items():
            self.delivered.setdefault(owner, []).extend(evs)


def test_accept_answers_full_and_duplicate_without_taking_anything() -> None:
    core = ReplicaCore(2, "inc", slots=2)
    assert core.accept(_item("a")) is None
    assert core.accept(_item("b")) is None
    full = core.accept(_item("c"))
    dup = core.accept(_item("a"))
    assert full is not None and (full.status, full.incarnation) == ("full", "inc")
    assert dup is not None and dup.status == "duplicate"
    assert core.book.taken() == 2
    assert core.admitted(_item("a")) == {OWNER: [Admitted("a", 2)]}


def test_a_failed_pull_frees_the_slot_and_tells_the_owner_to_retry() -> None:
    core = ReplicaCore(0, "inc", slots=1)
    item = _item("a", owner="ingress-b")
    assert core.accept(item) is None
    out, reply = core.pull_failed(item, "gone")
    assert reply.status == "failed"
    (err,) = out["ingress-b"]
    assert isinstance(err, StreamError) and err.retryable and "gone" in err.message
    assert core.book.taken() == 0 and core.accept(_item("b")) is None


def test_tokens_go_to_their_owner_and_every_taken_request_is_reported_once() -> None:
    core = ReplicaCore(0, "inc", slots=4, clock=ReportClock(0, full_every=1000))
    sh = Shell(core)
    _admit(core, _item("a", max_tokens=3))
    _admit(core, _item("b", max_tokens=2, owner="ingress-b"))
    for k in range(4):
        sh.step(now_s=0.1 * k)
    assert [e[3] for e in sh.delivered[OWNER]] == [1, 2]  # engine indexes 1.. (0: prefill)
    assert [e[3] for e in sh.delivered["ingress-b"]] == [1]
    finished = [f for r in sh.sent for f in zip(r.finished_ids, r.finished_output_tokens,
                                                strict=True)]
    assert sorted(finished) == [("a", 3), ("b", 2)]
    # the first report is full and post-step: b's one decode step was its last
    assert sh.sent[0].full and sh.sent[0].running_ids == ("a",)
    assert sh.sent[0].finished_ids == ("b",)
    assert core.step == 4 and core.last is not None and core.last.running_ids == ()


def test_a_member_with_nothing_new_stays_silent_until_its_full_state_is_due() -> None:
    core = ReplicaCore(1, "inc", slots=2, clock=ReportClock(1, full_every=4, keepalive_s=100))
    sh = Shell(core, Gen(rank=1, members=(0, 1)))
    _admit(core, _item("a", max_tokens=50))
    sent = []
    for k in range(8):
        news = sh.step(now_s=0.01 * k)
        sent.append((news.report, news.full))
    # step 1: the install (and the generation's first step) in full; (step + 1) % 4 == 0
    # at barrier steps 3 and 7: the periodic full state; otherwise nothing to say
    assert sent == [(True, True), (False, False), (True, True), (False, False),
                    (False, False), (False, False), (True, True), (False, False)]
    assert len(sh.sent) == 3 and all(r.full for r in sh.sent)


def test_rank_zero_reports_every_busy_step_with_the_rows_of_all() -> None:
    core = ReplicaCore(0, "inc", slots=2, clock=ReportClock(0, full_every=1000, keepalive_s=100),
                       with_compute=True)
    sh = Shell(core, Gen(rank=0, members=(0, 1)))
    sh.step(others_running=0)  # first step: full state
    sh.step(others_running=0)  # idle everywhere: silent
    sh.step(others_running=2)  # the peer is busy: rank 0 reports the rows
    assert len(sh.sent) == 2
    rep = sh.sent[-1]
    assert not rep.full and rep.barrier_running == (0, 2)
    assert rep.barrier_compute_s == (0.01, 0.01)


def test_a_delta_carries_only_the_requests_installed_since_the_last_report() -> None:
    core = ReplicaCore(0, "inc", slots=4, clock=ReportClock(0, full_every=1000, keepalive_s=100))
    sh = Shell(core)
    _admit(core, _item("a", max_tokens=20))
    sh.step()
    _admit(core, _item("b", max_tokens=20))
    sh.step(now_s=0.01)
    delta = sh.sent[-1]
    assert not delta.full and delta.running_ids == ("b",)
    assert core.last is not None and set(core.last.running_ids) == {"a", "b"}


def test_a_report_that_could_not_be_sent_goes_into_the_next_one_in_full() -> None:
    core = ReplicaCore(0, "inc", slots=2, clock=ReportClock(0, full_every=1000, keepalive_s=100))
    sh = Shell(core)
    _admit(core, _item("a", max_tokens=3))
    _admit(core, _item("b", max_tokens=30))
    sh.step()  # installs a and b (full, first step)
    sh.send_ok = False
    assert sh.step(now_s=0.01).finished == [("a", 3)]  # its report is lost
    assert len(sh.sent) == 1
    sh.send_ok = True
    news = sh.step(now_s=0.02)  # nothing new, but the lost report forces a full one
    assert news.report and news.full
    assert sh.sent[-1].finished_ids == ("a",) and sh.sent[-1].running_ids == ("b",)


def test_a_fresh_report_channel_starts_with_a_full_report() -> None:
    core = ReplicaCore(0, "inc", slots=2, clock=ReportClock(0, full_every=1000, keepalive_s=100))
    sh = Shell(core)
    sh.step()
    assert sh.step(now_s=0.01).report is False
    news = sh.step(now_s=0.02, fresh=True)
    assert news.report and news.full


def test_aborts_and_refused_installs_end_as_dropped_and_the_owner_hears_why() -> None:
    core = ReplicaCore(0, "inc", slots=4, clock=ReportClock(0, full_every=1000, keepalive_s=100))
    sh = Shell(core)
    _admit(core, _item("run", max_tokens=20))
    sh.step()
    core.abort("run")  # installed: leaves the engine at the next step
    pulling = _item("late")
    assert core.accept(pulling) is None
    core.abort("late")  # aborted during its pull: never installed
    taken, _ = core.pulled(pulling, b"xyz")
    assert not taken
    bad = _item("bad", prompt=3)
    assert core.accept(bad) is None
    core.pulled(bad, b"x")  # the emulated engine refuses a KV of the wrong size
    sh.step(now_s=0.01)
    assert sorted(sh.sent[-1].dropped_ids) == ["bad", "late", "run"]
    assert sh.engine.running() == 0 and core.book.taken() == 0
    errors = [e for e in sh.delivered[OWNER] if isinstance(e, StreamError)]
    assert [(e.request_id, e.retryable) for e in errors] == [("bad", False)]


def test_a_failed_remote_stream_is_dropped_with_the_engine_s_verdict() -> None:
    core = ReplicaCore(0, "inc", slots=4, clock=ReportClock(0, full_every=1000, keepalive_s=100))
    sh = Shell(core)
    _admit(core, _item("a", max_tokens=20))
    _admit(core, _item("b", max_tokens=20))
    sh.step()
    sh.engine.abort("a")
    sh.engine.abort("b")
    sh.failures = [("a", "stream broke", True), ("b", "bad request", False),
                   ("unknown", "not ours", True)]
    sh.step(now_s=0.01)
    errors = {e.request_id: e.retryable for e in sh.delivered[OWNER]
              if isinstance(e, StreamError)}
    assert errors == {"a": True, "b": False}
    assert sorted(sh.sent[-1].dropped_ids) == ["a", "b"]


def test_a_failed_exchange_still_counts_the_step_and_keeps_the_state() -> None:
    core = ReplicaCore(0, "inc", slots=2)
    sh = Shell(core)
    _admit(core, _item("a", max_tokens=20))
    sh.step(exchange_ok=False)
    assert core.step == 1 and core.last is not None and core.last.running_ids == ("a",)
    assert core.last.barrier_loads == ()  # no rows: nothing of the group in it


def test_join_answers_at_once_only_for_the_current_or_an_older_generation() -> None:
    core = ReplicaCore(0, "inc", slots=1)
    assert core.join_answer(1, connected=False) is None
    core.joined(3)
    assert core.join_answer(3, connected=True) is True
    assert core.join_answer(2, connected=True) is False
    assert core.join_answer(4, connected=True) is None
    assert core.join_answer(3, connected=False) is None  # its group broke: rejoin
