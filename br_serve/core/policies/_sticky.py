"""Dispatch for rules that bind a request to one rank when they first see it: by its
identity (a hash ring, a prefix tree), or, for the field's routers, at arrival (the real
router picks the rank when the request arrives and the rank's own queue holds it; here
the pool holds it). The request then waits in the pool until that rank has a slot and KV
room. The pool is still walked in arrival order, so each rank admits its own requests
first come, first served, and a request waiting for a full rank does not hold up requests
bound elsewhere.

``bind = "arrival"`` (:func:`arrival_dispatch`) turns a replica-choosing rule
(``choose(req, candidates, ledger)``) into such a rule: it chooses among all live ranks
(the router knows nothing of slots), and the ledger it reads counts each rank's bound
requests that still wait (the router's in-flight count includes them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Literal

from br_serve.core.policies.fcfs import Ledger
from br_serve.core.pool import PromptPool
from br_serve.core.types import Assignment, ClusterSnapshot, PoolRequest, TickResult

Bind = Literal["slot", "arrival"]
BIND_DOC = ("when the rank is chosen: 'slot' (when a rank has a free slot, from the "
            "pool: late binding) or 'arrival' (once, when the request is first seen, "
            "among all live ranks, as the real router does; the request then waits for "
            "that rank, and the rule's running counts include requests bound and waiting)")


class StickyTargets:
    """``request_id -> rank`` decided once per request (``decide`` is called on first
    sight, with this tick's ledger) and forgotten when the request is placed;
    ``pending[g]``: requests bound to ``g`` and still waiting."""

    def __init__(self) -> None:
        self._target: dict[str, int] = {}
        self.pending: list[int] = []

    def dispatch(self, cluster: ClusterSnapshot, pool: PromptPool,
                 decide: Callable[[PoolRequest, Ledger], int]) -> TickResult:
        led = Ledger(cluster)
        if len(self.pending) != len(led.alive):
            self.pending = [0] * len(led.alive)
        out: list[Assignment] = []
        if not any(led.alive):
            return TickResult(assignments=())
        for req in pool.fcfs():
            g = self._target.get(req.request_id)
            if g is None or not led.alive[g]:
                if g is not None:
                    self.pending[g] -= 1
                g = decide(req, led)
                self._target[req.request_id] = g
                self.pending[g] += 1
            if led.cap[g] <= 0 or led.kv_room[g] < req.prompt_tokens:
                continue
            led.admit(g, req.prompt_tokens)
            del self._target[req.request_id]
            self.pending[g] -= 1
            out.append(Assignment(req.request_id, g, req.prompt_tokens))
        return TickResult(assignments=tuple(out))

    def counting_pending(self, led: Ledger) -> Ledger:
        """A copy of ``led`` whose ``running`` also counts the bound, waiting requests."""
        view = copy.copy(led)
        view.running = [r + p for r, p in zip(led.running, self.pending, strict=True)]
        return view


def arrival_dispatch(sticky: StickyTargets, cluster: ClusterSnapshot, pool: PromptPool,
                     choose: Callable[[PoolRequest, list[int], Ledger], int]) -> TickResult:
    """Bind each request on first sight with ``choose`` over every live rank, reading
    running counts that include the bound, waiting requests (see the module docstring)."""

    def decide(req: PoolRequest, led: Ledger) -> int:
        live = [g for g, a in enumerate(led.alive) if a]
        return choose(req, live, sticky.counting_pending(led))

    return sticky.dispatch(cluster, pool, decide)
