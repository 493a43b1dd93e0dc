"""The scheduler's mirror of the decode replicas: measured rows plus what is in flight.

Pure (no Ray, no asyncio). Rows of replica ``g`` in :attr:`Mirror.state` are what its
reports said (its latest full report, changed by the deltas since) advanced by the
steps run since (every running request decodes one token per step: the group's rank 0
reports each step), plus the requests dispatched to ``g`` that no report has accounted
for yet (*in flight*; they do not advance). An in-flight entry leaves exactly when:

- a report of ``g`` lists it as running, finished or dropped;
- ``g`` refused it (``full``) or could not pull its KV (``failed``): the scheduler puts
  a refused request back in the pool at its FCFS position (:meth:`PromptPool.restore`);
- ``g`` died (entries without an answer go back to the pool; taken ones are lost with
  the replica, and their owners re-prefill them);
- a report with ``step >= taken_step + 2`` of the incarnation that took it does not
  list it: the replica's promise (:class:`AdmitReply`) was broken, so the entry is
  dropped (and counted in :attr:`Mirror.expired`) rather than kept as a phantom row.

So once every request has finished and every replica has reported, every slot is free
(``tests/serve/test_mirror.py`` checks it under any interleaving).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from br_serve.core import Assignment, ClusterSnapshot, PoolRequest
from br_serve.core.pool import PoolTicket
from br_serve.core.state import ClusterState
from br_serve.core.step import StepModel
from br_serve.serve.wire.messages import AdmitReply, ReplicaReport

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InFlight:
    """A dispatched request no report has shown yet. ``taken_step`` is -1 until the
    replica answered ``queued``/``duplicate``, then the step of its answer."""

    request: PoolRequest
    ticket: PoolTicket
    seq: int
    taken_step: int = -1
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class FinishedRow:
    """A request a report saw finish: what the predictor learns from."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    prefix_hash: int = -1


class Mirror:
    """``replicas`` replicas of ``slots`` slots and ``kv_limit_tokens`` KV tokens (None:
    unbounded), stepping as ``step_model``.

    ``engine_slots`` (None: ``slots``): how many requests each engine runs at once when
    ``slots`` also counts places in the engine's own queue (``pool.dispatch_ahead``).
    The engine admits its queue in binding order, so on each replica the rows bound
    after its first ``engine_slots`` are *queued*: they do not decode (the mirror does
    not advance them) and the snapshot shows them apart from the running ones.
    """

    def __init__(self, replicas: int, slots: int, step_model: StepModel,
                 kv_limit_tokens: int | None = None,
                 engine_slots: int | None = None) -> None:
        if engine_slots is not None and not 1 <= engine_slots <= slots:
            raise ValueError(f"engine_slots: {engine_slots} not in [1, {slots}]")
        self.g = replicas
        self.engine_slots = None if engine_slots == slots else engine_slots
        self.state = ClusterState(replicas, slots, kv_limit_tokens, step_model)
        self.inflight: list[dict[str, InFlight]] = [{} for _ in range(replicas)]
        self.incarnation: list[str] = [""] * replicas
        # what the policy knows of a running request beyond its row (arrival, prefix
        # key), kept from its dispatch until its row leaves the mirror
        self._requests: dict[str, PoolRequest] = {}
        self._seq = 0
        # rows a report described (they advance with the steps; in-flight rows do not),
        # and the (generation, barrier step) each replica's rows are advanced to
        self._live = np.zeros(self.state.occupied.shape, dtype=bool)
        self._adv: list[tuple[int, int]] = [(0, 0)] * replicas
        #: entries dropped because a report broke the replica's promise (a bug detector)
        self.expired = 0

    # -- queries --------------------------------------------------------------------
    def snapshot(self, detail: bool) -> ClusterSnapshot:
        if self.engine_slots is None:
            return self.state.snapshot(detail=detail)
        return self.state.snapshot(detail=detail, queued=self.queued(),
                                   engine_slots=self.engine_slots)

    def queued(self) -> np.ndarray:
        """The ``(G, B)`` mask of rows waiting in their engine's queue (none without
        ``engine_slots``)."""
        if self.engine_slots is None:
            return np.zeros(self.state.occupied.shape, dtype=bool)
        return self.state.fifo_queued(self.engine_slots)

    def _decoding(self) -> np.ndarray:
        """Rows a step advances: reported ones, less those queued at the engine."""
        if self.engine_slots is None:
            return self._live
        out: np.ndarray = self._live & ~self.queued()
        return out

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.state or any(request_id in f for f in self.inflight)

    def replica_of(self, request_id: str) -> int:
        """The replica that runs (or was sent) ``request_id``; -1 if none."""
        if request_id in self.state:
            return self.state.where(request_id)[0]
        return next((g for g, f in enumerate(self.inflight) if request_id in f), -1)

    def dispatch_of(self, request_id: str) -> int | None:
        """The number of the dispatch of ``request_id`` still in flight, if any."""
        for f in self.inflight:
            e = f.get(request_id)
            if e is not None:
                return e.seq
        return None

    def alive(self) -> np.ndarray:
        return self.state.alive

    def inflight_count(self) -> int:
        return sum(len(f) for f in self.inflight)

    # -- dispatch and answers -------------------------------------------------------
    def dispatch(self, a: Assignment, request: PoolRequest, ticket: PoolTicket) -> int:
        """Record an assignment the policy made (its slot is taken from now on).
        Returns the dispatch's number, which its answer must quote."""
        self._seq += 1
        self._admit_row(a.replica, a.request_id, a.prompt_tokens, 0, False, request)
        self.inflight[a.replica][a.request_id] = InFlight(request, ticket, self._seq)
        self._requests[a.request_id] = request
        return self._seq

    def answered(self, g: int, request_id: str, seq: int, reply: AdmitReply | None
                 ) -> InFlight | None:
        """Apply ``g``'s answer to dispatch ``seq`` (None: the call failed). Returns the
        entry if the request must go back to the pool (refused, or the call failed),
        else None. An answer to an older dispatch of the same id is ignored."""
        entry = self.inflight[g].get(request_id)
        if entry is None or entry.seq != seq:
            return None  # accounted for already, g died meanwhile, or a newer dispatch
        if reply is not None and reply.taken:
            entry.taken_step, entry.incarnation = reply.step, reply.incarnation
            return None
        self._forget(g, request_id)
        if reply is not None and reply.status == "failed":
            return None  # never runs; its owner re-prefills (it got a StreamError)
        return entry

    def _forget(self, g: int, request_id: str) -> None:
        self.inflight[g].pop(request_id, None)
        if request_id in self.state and self.state.where(request_id)[0] == g:
            self.state.finish(request_id)
        if request_id not in self:
            self._requests.pop(request_id, None)

    # -- reports --------------------------------------------------------------------
    def advance(self, members: tuple[int, ...], generation: int, step: int) -> None:
        """Rank 0's report: every member finished barrier step ``step`` of
        ``generation``; their reported rows decode one token per step."""
        inc = np.zeros(self.g, dtype=np.int64)
        for g in members:
            gen, at = self._adv[g]
            if gen != generation:
                self._adv[g] = (generation, step)
            elif step > at:
                inc[g] = step - at
                self._adv[g] = (generation, step)
        if inc.any():
            self.state.advance(inc, self._decoding())

    def _advance_to(self, g: int, generation: int, step: int) -> int:
        """Bring ``g``'s reported rows to ``step``; returns how many steps they are now
        ahead of ``step`` (rows a report of ``step`` gives must be moved that far)."""
        gen, at = self._adv[g]
        if gen != generation:  # a new generation restarts the count
            self._adv[g] = (generation, step)
            return 0
        if step > at:
            where = np.zeros_like(self._live)
            where[g] = self._decoding()[g]
            self.state.advance(step - at, where)
            self._adv[g] = (generation, step)
            return 0
        return at - step

    def apply_report(self, rep: ReplicaReport) -> list[FinishedRow]:
        """Apply replica ``rep.replica``'s report (full: its rows are replaced; delta:
        finished and dropped rows go, installed ones come); returns the finished rows."""
        g = rep.replica
        if rep.incarnation:
            if self.incarnation[g] and rep.incarnation != self.incarnation[g]:
                return []  # a stale report of a replaced actor
            self.incarnation[g] = rep.incarnation
        st = self.state
        finished = [FinishedRow(rid, int(st.prompt[st.where(rid)]), out,
                                int(st.prefix[st.where(rid)]))
                    for rid, out in zip(rep.finished_ids, rep.finished_output_tokens,
                                        strict=True)
                    if rid in st and st.where(rid)[0] == g]
        infl = self.inflight[g]
        for rid in (*rep.running_ids, *rep.finished_ids, *rep.dropped_ids):
            infl.pop(rid, None)
        for rid in [r for r, e in infl.items() if e.taken_step >= 0
                    and e.incarnation == rep.incarnation and rep.step >= e.taken_step + 2]:
            log.warning("mirror: replica %d never reported %s (taken at step %d, now %d)",
                        g, rid, infl[rid].taken_step, rep.step)
            del infl[rid]
            self.expired += 1
        lag = self._advance_to(g, rep.generation, rep.barrier_step)
        rows = [(r, p, d + lag) for r, p, d in zip(rep.running_ids, rep.prompt_tokens,
                                                    rep.decoded_tokens, strict=True)]
        if rep.full:
            self._rebuild(g, rows)
        else:
            self._apply_delta(g, rows, (*rep.finished_ids, *rep.dropped_ids))
        return finished

    def _admit_row(self, g: int, rid: str, prompt: int, decoded: int, live: bool,
                   request: PoolRequest | None, bound_order: int | None = None) -> None:
        self.state.admit(Assignment(rid, g, prompt), request, decoded_tokens=decoded,
                         bound_order=bound_order)
        self._live[self.state.where(rid)] = live

    def _apply_delta(self, g: int, started: list[tuple[str, int, int]],
                     ended: tuple[str, ...]) -> None:
        st = self.state
        for rid in ended:
            if rid in st and st.where(rid)[0] == g:
                st.finish(rid)
                if rid not in self:
                    self._requests.pop(rid, None)
        if not st.alive[g]:
            return
        for rid, p, d in started:
            order = None
            if rid in st:
                if st.where(rid)[0] != g:
                    continue  # reported by two replicas across a migration; keep the first
                order = st.bound_order_of(rid)  # its place in the engine's queue
                st.finish(rid)  # its in-flight row becomes a measured one
            if st.free_slots()[g] > 0:
                self._admit_row(g, rid, p, d, True, self._requests.get(rid), order)
        self._add_inflight_rows(g)

    def _rebuild(self, g: int, rows: Iterable[tuple[str, int, int]]) -> None:
        st = self.state
        old = [i for i in st.ids[g] if i is not None]
        orders = {rid: st.bound_order_of(rid) for rid in old}
        for rid in old:
            st.finish(rid)
        if st.alive[g]:
            for rid, p, d in rows:
                if rid in st:
                    continue  # reported by two replicas across a migration; keep the first
                self._admit_row(g, rid, p, d, True, self._requests.get(rid),
                                orders.get(rid))
            self._add_inflight_rows(g)
        for rid in old:
            if rid not in self:
                self._requests.pop(rid, None)

    def _add_inflight_rows(self, g: int) -> None:
        st = self.state
        free = int(st.free_slots()[g])
        for rid, e in self.inflight[g].items():
            if free <= 0:
                break  # more in flight than slots: a report will show which ran
            if rid not in st:
                self._admit_row(g, rid, e.request.prompt_tokens, 0, False, e.request)
                free -= 1

    # -- membership -----------------------------------------------------------------
    def set_dead(self, g: int) -> tuple[list[InFlight], list[str]]:
        """Replica ``g`` is gone. Returns (unanswered entries: back to the pool, ids it
        had taken: lost with it)."""
        back = [e for e in self.inflight[g].values() if e.taken_step < 0]
        lost = [r for r, e in self.inflight[g].items() if e.taken_step >= 0]
        lost += [r for r in self.state.set_alive(g, False) if r not in self.inflight[g]]
        self.inflight[g].clear()
        for rid in lost:
            self._requests.pop(rid, None)
        for e in back:
            self._requests.pop(e.request.request_id, None)
        return back, lost

    def set_alive(self, g: int, incarnation: str) -> None:
        """Replica ``g`` (instance ``incarnation``) can take requests; a new instance
        starts empty."""
        if incarnation != self.incarnation[g]:
            for rid in [i for i in self.state.ids[g] if i is not None]:
                self.state.finish(rid)
                self._requests.pop(rid, None)
            for rid in self.inflight[g]:
                self._requests.pop(rid, None)
            self.inflight[g].clear()
        self.incarnation[g] = incarnation
        self._adv[g] = (0, 0)
        self.state.set_alive(g, True)
