"""Overload control at the ingress, before any prefill work (pure; injected clock).

The graph can hold ``alive replicas * slots`` running requests plus ``pool_capacity``
waiting ones. A request beyond that would be prefilled only to be refused by the
scheduler's full pool (a late 429, after its prefill ran). :class:`AdmissionGate`
counts the requests this ingress has accepted and not yet finished (in prefill, in the
pool, running), takes the larger of that and the scheduler's own count (which includes
other ingress replicas' requests past prefill), and refuses at once when the graph is
full, with a ``Retry-After`` from the recent completion rate.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

#: completions older than this do not count towards the drain rate
RATE_WINDOW_S = 10.0
MAX_RETRY_AFTER_S = 30


class AdmissionGate:
    """See the module docstring. ``enter`` before prefill, ``leave`` when done."""

    def __init__(self, replicas: int, slots: int, pool_capacity: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = slots
        self.pool_capacity = pool_capacity
        self.alive = replicas
        self.inside = 0
        self.elsewhere = 0  # the scheduler's count of requests past prefill (all ingresses)
        # requests given up since the last / the one before the last observation: still
        # held at the scheduler until their abort lands, so still counted (see leave)
        self._given_up = [0, 0]
        self._clock = clock
        self._done: collections.deque[float] = collections.deque()

    def capacity(self) -> int:
        return self.alive * self.slots + self.pool_capacity

    def observe(self, alive_replicas: int, scheduler_requests: int) -> None:
        """The scheduler's latest view: alive replicas, requests in pool + running."""
        self.alive = alive_replicas
        self.elsewhere = scheduler_requests
        self._given_up = [0, self._given_up[0]]  # an observation may predate an abort

    def enter(self) -> int | None:
        """Admit one request (None) or refuse it: the seconds to wait before a retry."""
        load = self.load()
        if load < self.capacity():
            self.inside += 1
            self.elsewhere += 1  # until the next observation says otherwise
            return None
        return self.retry_after_s(load - self.capacity() + 1)

    def load(self) -> int:
        """Requests the graph holds or will hold, as far as this ingress can tell."""
        return max(self.inside + sum(self._given_up), self.elsewhere)

    def leave(self, released: bool = True) -> None:
        """One admitted request is done (finished, failed or given up). ``released``:
        its slot or pool entry is already free (it finished); a request given up
        mid-way (the client went away) is still held at the scheduler until its abort
        lands, so it stays counted until two more observations of the scheduler have
        come in (counting it free at once let a burst with disconnects overrun the
        pool after prefill)."""
        self.inside = max(self.inside - 1, 0)
        if released:
            self.elsewhere = max(self.elsewhere - 1, 0)
        else:
            self._given_up[0] += 1
        now = self._clock()
        self._done.append(now)
        while self._done and now - self._done[0] > RATE_WINDOW_S:
            self._done.popleft()

    def retry_after_s(self, excess: int) -> int:
        """Whole seconds until ``excess`` requests have left, at the recent rate."""
        now = self._clock()
        recent = [t for t in self._done if now - t <= RATE_WINDOW_S]
        if not recent:
            return 1
        rate = len(recent) / RATE_WINDOW_S
        return int(min(max(math.ceil(excess / rate), 1), MAX_RETRY_AFTER_S))
