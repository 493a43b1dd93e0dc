"""Mutable cluster state: the one place where replica loads change.

The simulator drives it directly; the scheduler actor keeps one as its mirror of the
decode replicas (rebuilt from their reports). Storage is a ``(G, B)`` grid of slots
held in numpy arrays, so stepping and snapshotting are vectorised.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from br_serve.core.step import StepModel
from br_serve.core.types import (
    UNLIMITED_TOKENS,
    Assignment,
    ClusterSnapshot,
    IntArray,
    PoolRequest,
    RunningRequests,
)


class ClusterState:
    """``G`` replicas with ``slots`` each, their running requests and their loads.

    Invariants: a request id occupies at most one slot; replica ``g`` never holds more
    than ``slots[g]`` requests; ``load(g) = sum(prompt + decoded)`` over its slots.

    Raises:
        ValueError: bad sizes at construction; admitting to a full or dead replica, an
            unknown replica, or an id already running.
        KeyError: finishing an id that is not running.
    """

    def __init__(
        self,
        replicas: int,
        slots: int | npt.ArrayLike,
        kv_limit_tokens: int | npt.ArrayLike | None = None,
        step: StepModel | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas: must be >= 1")
        self.g = replicas
        self.slots: IntArray = np.broadcast_to(np.asarray(slots, dtype=np.int64),
                                               (replicas,)).copy()
        if (self.slots < 1).any():
            raise ValueError("slots: must be >= 1")
        lim = UNLIMITED_TOKENS if kv_limit_tokens is None else kv_limit_tokens
        self.kv_limit: IntArray = np.broadcast_to(np.asarray(lim, dtype=np.int64),
                                                  (replicas,)).copy()
        self.step = (step or StepModel()).for_replicas(replicas)
        self.step_a, self.step_b, self.step_c = (x.copy() for x in self.step.arrays(replicas))
        self.alive = np.ones(replicas, dtype=bool)
        b = int(self.slots.max())
        shape = (replicas, b)
        self.occupied = np.zeros(shape, dtype=bool)
        self.prompt = np.zeros(shape, dtype=np.int64)
        self.decoded = np.zeros(shape, dtype=np.int64)
        self.arrival = np.zeros(shape, dtype=np.float64)
        self.prefix = np.full(shape, -1, dtype=np.int64)
        #: true total output, -1 when unknown (only the simulator knows it)
        self.target = np.full(shape, -1, dtype=np.int64)
        #: when each row was bound (a counter): an engine queue admits in this order
        self.bound_order = np.zeros(shape, dtype=np.int64)
        self._bound = 0
        self.ids: list[list[str | None]] = [[None] * b for _ in range(replicas)]
        self.hash_ids: dict[str, tuple[int, ...] | None] = {}
        self._where: dict[str, tuple[int, int]] = {}

    # -- queries -------------------------------------------------------------------
    def load_tokens(self) -> IntArray:
        out: IntArray = ((self.prompt + self.decoded) * self.occupied).sum(axis=1)
        return out

    def running_requests(self) -> IntArray:
        out: IntArray = self.occupied.sum(axis=1)
        return out

    def free_slots(self) -> IntArray:
        out: IntArray = np.where(self.alive, self.slots - self.running_requests(), 0)
        return out

    def fifo_queued(self, engine_slots: int) -> npt.NDArray[np.bool_]:
        """The ``(G, B)`` mask of rows waiting in their engine's queue when each engine
        runs ``engine_slots`` requests and admits in binding order (FIFO): on every
        replica, the rows bound after its first ``engine_slots``."""
        order = np.where(self.occupied, self.bound_order, np.iinfo(np.int64).max)
        rank = np.argsort(np.argsort(order, axis=1, kind="stable"), axis=1)
        out: npt.NDArray[np.bool_] = self.occupied & (rank >= engine_slots)
        return out

    def bound_order_of(self, request_id: str) -> int:
        return int(self.bound_order[self._where[request_id]])

    def where(self, request_id: str) -> tuple[int, int]:
        return self._where[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def snapshot(self, detail: bool = True, oracle: bool = False,
                 queued: npt.NDArray[np.bool_] | None = None,
                 engine_slots: int | None = None) -> ClusterSnapshot:
        """Freeze the current state for a policy.

        ``detail`` adds the per-request rows BR-H needs; ``oracle`` also attaches the
        true remaining steps (only meaningful where ``target`` was given). ``queued``
        (a ``(G, B)`` mask) marks the rows waiting in an engine queue, which run
        ``engine_slots`` at once: the snapshot then tells them apart.
        """
        running = None
        if detail:
            gi, si = np.nonzero(self.occupied)
            ids = tuple(str(self.ids[g][s]) for g, s in zip(gi.tolist(), si.tolist(),
                                                             strict=True))
            rem = None
            if oracle:  # unknown targets (-1) never finish as far as the oracle knows
                tgt = self.target[gi, si]
                rem = np.where(tgt >= 0, np.maximum(tgt - self.decoded[gi, si], 0),
                               UNLIMITED_TOKENS)
            running = RunningRequests.build(
                gi, self.prompt[gi, si], self.decoded[gi, si], self.arrival[gi, si],
                self.prefix[gi, si], request_ids=ids,
                hash_ids=tuple(self.hash_ids.get(i) for i in ids),
                true_remaining_steps=rem)
        qt = qn = None
        if queued is not None:
            q = queued & self.occupied
            qt = ((self.prompt + self.decoded) * q).sum(axis=1)
            qn = q.sum(axis=1)
        return ClusterSnapshot.build(
            self.load_tokens(), self.running_requests(), self.slots, self.kv_limit,
            self.alive, self.step_a, self.step_b, running, self.step_c,
            queued_tokens=qt, queued_requests=qn, engine_slots=engine_slots)

    # -- changes -------------------------------------------------------------------
    def admit(self, assignment: Assignment, request: PoolRequest | None = None,
              output_tokens: int = -1, decoded_tokens: int = 0,
              bound_order: int | None = None) -> None:
        """Place one assigned request in a free slot of its replica (bound now, or at
        ``bound_order``: a row that keeps its place in the engine's queue)."""
        g = assignment.replica
        if not 0 <= g < self.g:
            raise ValueError(f"replica: {g} out of range [0, {self.g})")
        if not self.alive[g]:
            raise ValueError(f"replica: {g} is not alive")
        rid = assignment.request_id
        if rid in self._where:
            raise ValueError(f"request_id: {rid!r} is already running")
        free = np.flatnonzero(~self.occupied[g, : self.slots[g]])
        if free.size == 0:
            raise ValueError(f"replica: {g} has no free slot")
        s = int(free[0])
        self.occupied[g, s] = True
        self.prompt[g, s] = assignment.prompt_tokens
        self.decoded[g, s] = decoded_tokens
        self.target[g, s] = output_tokens
        self.arrival[g, s] = request.arrival_s if request else 0.0
        ph = request.prefix_hash if request else None
        self.prefix[g, s] = -1 if ph is None else ph
        self.ids[g][s] = rid
        if bound_order is None:
            self._bound += 1
            bound_order = self._bound
        self.bound_order[g, s] = bound_order
        self.hash_ids[rid] = request.hash_ids if request else None
        self._where[rid] = (g, s)

    def advance(self, steps: int | npt.ArrayLike = 1,
                where: npt.NDArray[np.bool_] | None = None) -> None:
        """Every running request decodes ``steps`` more tokens (one count, or one per
        replica); ``where`` (a ``(G, B)`` mask) limits it to some slots."""
        inc = np.asarray(steps, dtype=np.int64)
        if inc.ndim:
            inc = inc.reshape(-1, 1)
        mask = self.occupied if where is None else self.occupied & where
        self.decoded += mask * inc

    def set_decoded(self, request_id: str, decoded_tokens: int) -> None:
        g, s = self._where[request_id]
        self.decoded[g, s] = decoded_tokens

    def finish(self, request_id: str) -> tuple[int, int]:
        """Free the slot of ``request_id``; returns ``(prompt, decoded)`` tokens."""
        g, s = self._where.pop(request_id)
        out = int(self.prompt[g, s]), int(self.decoded[g, s])
        self.occupied[g, s] = False
        self.prompt[g, s] = self.decoded[g, s] = 0
        self.target[g, s] = -1
        self.prefix[g, s] = -1
        self.ids[g][s] = None
        self.hash_ids.pop(request_id, None)
        return out

    def finished_by_target(self) -> list[str]:
        """Ids whose decoded count reached their known target output."""
        gi, si = np.nonzero(self.occupied & (self.target >= 0) & (self.decoded >= self.target))
        return [str(self.ids[g][s]) for g, s in zip(gi.tolist(), si.tolist(), strict=True)]

    def set_alive(self, replica: int, alive: bool) -> list[str]:
        """Mark a replica dead or alive. Killing it evicts and returns its request ids."""
        self.alive[replica] = alive
        if alive:
            return []
        evicted = [i for i in self.ids[replica] if i is not None]
        for rid in evicted:
            self.finish(rid)
        return evicted
