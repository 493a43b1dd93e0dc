"""The decode replica's decisions, without Ray, threads or sockets (pure; tested alone).

:class:`ReplicaCore` is what a decode replica *decides*; the actor
(:mod:`br_serve.serve.replica.decode`) is what it *does*: Ray RPCs, the step thread,
the KV pull, the engine's step, the barrier collective, the event outboxes and
channels, the calls to the scheduler. The actor keeps one core under its lock, tells
it what happened and carries out what it answers:

- **admission** (:meth:`accept`, :meth:`pulled`, :meth:`pull_failed`): whether a slot is
  free (the :class:`AdmitReply`), the ``Admitted`` event that must reach the owner before
  any token (:meth:`admitted`), the retryable ``StreamError`` of a failed pull;
- **aborts** (:meth:`abort`) and the **install** of queued requests at the start of a
  step (:meth:`take_work`, :meth:`install_failed`);
- **after the engine stepped** (:meth:`after_step`): the step's events grouped by owner,
  the failures of a remote engine's streams turned into ``StreamError``s, what the next
  report carries (finished, dropped, installed) and whether this member reports this
  step, and in full (:class:`ReportClock`), i.e. the flag it puts into the exchange;
- **after the exchange** (:meth:`after_exchange`): the step counted, the replica's
  latest full report kept (a restarted scheduler reads it), and the report to send, if
  any (rank 0 also reports every step in which any member had work), as a delta when
  not due in full; :meth:`report_sent` puts a report that could not be sent back into
  the next one;
- the **barrier generation** it is in, and what a ``join`` answers without waiting.

Every method is synchronous and not thread-safe: the actor serialises them (its lock).
The promise of the book (:mod:`br_serve.serve.replica.book`) holds through it: every
request it took ends finished, dropped or failed, in a later report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from br_serve.engine.base import DecodeEngine, TokenEvent
from br_serve.serve.replica.book import ReplicaBook, ReportClock, as_delta, build_report
from br_serve.serve.wire.messages import (
    Admission,
    AdmitReply,
    Admitted,
    ReplicaReport,
    StreamError,
    WireEvent,
)

#: events for each owner (an ingress replica), in order
Outgoing = dict[str, list[WireEvent]]
#: a remote engine's failed stream: ``(request id, message, retryable)``
Failure = tuple[str, str, bool]


@dataclass(frozen=True, slots=True)
class StepNews:
    """What one step produced, decided before its barrier exchange.

    ``events``: the step's tokens and errors by owner (delivered after the exchange);
    ``finished`` / ``dropped`` / ``started``: what the next report carries;
    ``report``: whether this member reports this step (its flag in the exchange);
    ``full``: whether that report is due in full (else a delta).
    """

    events: Outgoing
    finished: list[tuple[str, int]]
    dropped: list[str]
    started: list[str]
    report: bool
    full: bool


class ReplicaCore:
    """Decode replica ``index`` (actor instance ``incarnation``) with ``slots`` slots;
    see the module docstring. ``with_compute``: rank 0's reports carry every member's
    measured compute time (the scheduler calibrates step costs online)."""

    def __init__(self, index: int, incarnation: str, slots: int, with_compute: bool = False,
                 clock: ReportClock | None = None) -> None:
        self.index = index
        self.incarnation = incarnation
        self.with_compute = with_compute
        self.book = ReplicaBook(slots)
        self.clock = clock if clock is not None else ReportClock(index)
        #: steps run so far (failed exchanges included)
        self.step = 0
        #: the barrier generation this replica last joined (0: none yet)
        self.generation = 0
        #: the latest full report (what a restarted scheduler rebuilds its mirror from)
        self.last: ReplicaReport | None = None

    def _reply(self, status: Any) -> AdmitReply:
        return AdmitReply(status, self.step, self.incarnation)

    # -- admission (the RPC side) ---------------------------------------------------
    def accept(self, item: Admission) -> AdmitReply | None:
        """Reserve a slot for ``item``. None: taken, pull its KV now; else the answer
        (``duplicate`` or ``full``; nothing was taken)."""
        status = self.book.accept(item.request_id, item.owner)
        return None if status == "queued" else self._reply(status)

    def pull_failed(self, item: Admission, message: str) -> tuple[Outgoing, AdmitReply]:
        """The KV of a taken request could not be pulled: it never runs here; its owner
        gets a retryable error (it re-prefills)."""
        owner = self.book.pull_failed(item.request_id) or item.owner
        err = StreamError(item.request_id, f"kv pull failed: {message}", retryable=True)
        return {owner: [err]}, self._reply("failed")

    def admitted(self, item: Admission) -> Outgoing:
        """The ``Admitted`` event of a pulled request: delivered *before* :meth:`pulled`
        lets the step thread produce its tokens."""
        return {item.owner: [Admitted(item.request_id, self.index)]}

    def pulled(self, item: Admission, kv: Any) -> tuple[bool, AdmitReply]:
        """The KV is here: queue the request for the next step. ``(taken, reply)``;
        not taken when its owner aborted it during the pull (then it is dropped, and
        the KV source is not consumed)."""
        return self.book.pulled(item, kv), self._reply("queued")

    def abort(self, request_id: str) -> None:
        """The owner gave ``request_id`` up (no-op if not held here)."""
        self.book.abort(request_id)

    def has_work(self) -> bool:
        return self.book.has_work()

    # -- the step -------------------------------------------------------------------
    def take_work(self) -> tuple[list[tuple[Admission, Any]], list[str]]:
        """At the start of a step: ``(installs, aborts)`` for the engine."""
        return self.book.take_work()

    def install_failed(self, item: Admission, message: str) -> Outgoing:
        """The engine refused to install ``item``: dropped; its owner gets a
        (non-retryable) error."""
        owner = self.book.install_failed(item.request_id) or item.owner
        return {owner: [StreamError(item.request_id, f"admit failed: {message}")]}

    def after_step(self, events: Iterable[TokenEvent], failures: Sequence[Failure], *,
                   barrier_step: int, now_s: float, fresh_channel: bool = False
                   ) -> StepNews:
        """The engine stepped (``events``; ``failures``: its broken remote streams):
        route the events, end the failed requests, take what the report carries and
        decide whether this member reports the step about to be exchanged as
        ``barrier_step``. ``fresh_channel``: reports go over a newly opened report
        channel, which starts with a full report."""
        by_owner = self.book.route(events)
        for rid, message, retryable in failures:
            owner = self.book.install_failed(rid)
            if owner is not None:
                by_owner.setdefault(owner, []).append(StreamError(rid, message, retryable))
        finished, dropped, started = self.book.take_report()
        if fresh_channel:
            self.clock.sent(False, now_s)
        report, full = self.clock.decide(news=bool(finished or dropped or started),
                                         barrier_step=barrier_step, now_s=now_s)
        return StepNews(by_owner, finished, dropped, started, report, full)

    def count_step(self) -> None:
        """The step (and its exchange, successful or not) is over."""
        self.step += 1

    def after_exchange(self, news: StepNews, engine: DecodeEngine, barrier: Any,
                       rows: Any, *, compute_s: float, barrier_s: float
                       ) -> ReplicaReport | None:
        """The exchange returned ``rows`` (None: it failed): keep the full report of
        this step, and return the report to send now (None: nothing to say)."""
        group_rows = rows if rows is not None and barrier.rank == 0 else None
        rep = build_report(self.index, self.incarnation, engine, self.step, barrier,
                           group_rows, news.finished, news.dropped, news.started,
                           full=True, compute_s=compute_s, barrier_s=barrier_s,
                           with_compute=self.with_compute)
        self.last = rep
        if not (news.report or (group_rows is not None and bool(group_rows[:, 1].any()))):
            return None
        return rep if news.full else as_delta(rep, news.started)

    def report_sent(self, news: StepNews, ok: bool, now_s: float) -> None:
        """What became of the report of ``news``: one that was not sent puts its
        finished and dropped ids into the next report, which goes in full."""
        self.clock.sent(ok, now_s)
        if not ok:
            self.book.put_back(news.finished, news.dropped)

    # -- barrier generations ----------------------------------------------------------
    def join_answer(self, generation: int, connected: bool) -> bool | None:
        """What ``join(generation)`` answers at once while the replica is
        ``connected`` to a group: True (already in it), False (an older one), or None
        (join it)."""
        if connected and generation <= self.generation:
            return generation == self.generation
        return None

    def joined(self, generation: int) -> None:
        self.generation = generation
