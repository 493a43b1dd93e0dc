"""The scheduler's mirror of the decode replicas: measured rows plus what is in flight.

Pure (no Ray, no asyncio). Rows of replica ``g`` in :attr:`Mirror.state` are always its
latest :class:`ReplicaReport` (the truth at that step) plus the requests dispatched to
``g`` that no report has accounted for yet (*in flight*). An in-flight entry leaves
exactly when:

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
import numpy.typing as npt

from br_serve.core import Assignment, ClusterSnapshot, PoolRequest
from br_serve.core.pool import PoolTicket
from br_serve.core.state import ClusterState
from br_serve.serve.messages import AdmitReply, ReplicaReport

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
    """``replicas`` replicas of ``slots`` slots; ``step_model`` is ``(a, b, c)``."""

    def __init__(self, replicas: int, slots: int,
                 step_model: tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike]) -> None:
        self.g = replicas
        self.state = ClusterState(replicas, slots, None, *step_model)
        self.inflight: list[dict[str, InFlight]] = [{} for _ in range(replicas)]
        self.incarnation: list[str] = [""] * replicas
        # what the policy knows of a running request beyond its row (arrival, prefix
        # key), kept from its dispatch until its row leaves the mirror
        self._requests: dict[str, PoolRequest] = {}
        self._seq = 0
        #: entries dropped because a report broke the replica's promise (a bug detector)
        self.expired = 0

    # -- queries --------------------------------------------------------------------
    def snapshot(self, detail: bool) -> ClusterSnapshot:
        return self.state.snapshot(detail=detail)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.state or any(request_id in f for f in self.inflight)

    def replica_of(self, request_id: str) -> int:
        """The replica that runs (or was sent) ``request_id``; -1 if none."""
        if request_id in self.state:
            return self.state.where(request_id)[0]
        return next((g for g, f in enumerate(self.inflight) if request_id in f), -1)

    def alive(self) -> np.ndarray:
        return self.state.alive

    def inflight_count(self) -> int:
        return sum(len(f) for f in self.inflight)

    # -- dispatch and answers -------------------------------------------------------
    def dispatch(self, a: Assignment, request: PoolRequest, ticket: PoolTicket) -> int:
        """Record an assignment the policy made (its slot is taken from now on).
        Returns the dispatch's number, which its answer must quote."""
        self._seq += 1
        self.state.admit(a, request)
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
    def apply_report(self, rep: ReplicaReport) -> list[FinishedRow]:
        """Rebuild replica ``rep.replica``'s rows; returns the rows that finished."""
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
        self._rebuild(g, zip(rep.running_ids, rep.prompt_tokens, rep.decoded_tokens,
                             strict=True))
        return finished

    def _rebuild(self, g: int, rows: Iterable[tuple[str, int, int]]) -> None:
        st = self.state
        old = [i for i in st.ids[g] if i is not None]
        for rid in old:
            st.finish(rid)
        if st.alive[g]:
            for rid, p, d in rows:
                if rid in st:
                    continue  # reported by two replicas across a migration; keep the first
                st.admit(Assignment(rid, g, p), self._requests.get(rid), decoded_tokens=d)
            free = int(st.free_slots()[g])
            for rid, e in self.inflight[g].items():
                if free <= 0:
                    break  # more in flight than slots: the report will show which ran
                if rid not in st:
                    st.admit(Assignment(rid, g, e.request.prompt_tokens), e.request)
                    free -= 1
        for rid in old:
            if rid not in self:
                self._requests.pop(rid, None)

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
        self.state.set_alive(g, True)
