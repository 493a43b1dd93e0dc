"""How requests reach the prompt pool: finite prefill instances, or a saturated backlog.

Both feeders add :class:`PoolRequest` s to the pool as their time comes and respect the
pool's capacity (backpressure). Only whole-pool operations happen here; the decode side
lives in :mod:`br_serve.sim.engine`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

import numpy as np

from br_serve.core import PoolRequest, PromptPool

MakeRequest = Callable[[int, float, int], PoolRequest]
"""``make(i, enqueued_s, enqueued_step)`` -> the pool entry of trace row ``i``."""


class PrefillFeeder:
    """``instances`` FIFO prefill servers; prefill of ``s`` tokens takes ``p0 + p1*s`` s.

    Requests start in arrival order on the earliest-free instance. A finished prefill
    enters the pool at its finish time if the pool has room; otherwise it stays on its
    instance (which stalls) until :meth:`on_room` finds room.
    """

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, instances: int,
                 p0_s: float, p1_s_per_token: float, make: MakeRequest) -> None:
        self.arrival = arrival_s.tolist()
        self.cost = (p0_s + p1_s_per_token * prompt_tokens.astype(np.float64)).tolist()
        self.n = len(self.arrival)
        self.make = make
        self.next = 0
        self.inflight: list[tuple[float, int, int]] = []  # (done_s, row, instance)
        self.blocked: deque[tuple[int, int]] = deque()  # (instance, row)
        for inst in range(instances):
            self._start(inst, 0.0)

    def _start(self, inst: int, free_s: float) -> None:
        if self.next >= self.n:
            return
        i = self.next
        self.next += 1
        done = max(free_s, self.arrival[i]) + self.cost[i]
        heapq.heappush(self.inflight, (done, i, inst))

    def deliver(self, now_s: float, step: int, pool: PromptPool,
                limit: int | None = None) -> int:
        """Move every prefill finished by ``now_s`` into the pool (room permitting), or
        only the first ``limit`` of them, in finishing order."""
        added = 0
        while self.inflight and self.inflight[0][0] <= now_s and (limit is None
                                                                  or added < limit):
            done, i, inst = heapq.heappop(self.inflight)
            if self.blocked or pool.is_full():
                self.blocked.append((inst, i))
                continue
            pool.add(self.make(i, done, step))
            added += 1
            self._start(inst, done)
        return added

    def on_room(self, now_s: float, step: int, pool: PromptPool,
                limit: int | None = None) -> int:
        """The pool lost requests at ``now_s``: unblock stalled instances, then deliver
        (at most ``limit`` requests in all)."""
        added = 0
        while self.blocked and not pool.is_full() and (limit is None or added < limit):
            inst, i = self.blocked.popleft()
            pool.add(self.make(i, now_s, step))
            added += 1
            self._start(inst, now_s)
        return added + self.deliver(now_s, step, pool,
                                    None if limit is None else limit - added)

    def waiting(self, now_s: float, pool: PromptPool) -> bool:
        """A prefill could still enter the pool at ``now_s``: one finished and not yet
        delivered, or a stalled instance's with room for it."""
        return ((bool(self.inflight) and self.inflight[0][0] <= now_s)
                or (bool(self.blocked) and not pool.is_full()))

    def next_event_s(self) -> float | None:
        """When the next prefill finishes, or None when nothing is in flight."""
        return self.inflight[0][0] if self.inflight else None

    @property
    def exhausted(self) -> bool:
        return self.next >= self.n and not self.inflight and not self.blocked


class BacklogFeeder:
    """Saturated mode: every request is prefilled at t = 0 and waits in a backlog; the
    pool is topped up to capacity whenever it has room (entry time = that moment)."""

    def __init__(self, n: int, make: MakeRequest) -> None:
        self.n = n
        self.next = 0
        self.make = make

    def deliver(self, now_s: float, step: int, pool: PromptPool,
                limit: int | None = None) -> int:
        added = 0
        while self.next < self.n and not pool.is_full() and (limit is None
                                                             or added < limit):
            pool.add(self.make(self.next, now_s, step))
            self.next += 1
            added += 1
        return added

    def on_room(self, now_s: float, step: int, pool: PromptPool,
                limit: int | None = None) -> int:
        return self.deliver(now_s, step, pool, limit)

    def waiting(self, now_s: float, pool: PromptPool) -> bool:
        return False  # the backlog tops the pool up on room, never on time

    def next_event_s(self) -> float | None:
        return None

    @property
    def exhausted(self) -> bool:
        return self.next >= self.n
