"""Dispatch for rules that bind a request to one rank by its identity (a hash ring, a
prefix tree): the rank is chosen once, when the request is first seen, and the request
waits in the pool until that rank has a slot and KV room (the real router sends it there
at arrival and the rank's own queue holds it; here the pool holds it). The pool is still
walked in arrival order, so each rank admits its own requests first come, first served,
and a request waiting for a full rank does not hold up requests bound elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from br_serve.core.policies.fcfs import Ledger
from br_serve.core.pool import PromptPool
from br_serve.core.types import Assignment, ClusterSnapshot, PoolRequest, TickResult


class StickyTargets:
    """``request_id -> rank`` decided once per request (``decide`` is called on first
    sight, with this tick's ledger) and forgotten when the request is placed."""

    def __init__(self) -> None:
        self._target: dict[str, int] = {}

    def dispatch(self, cluster: ClusterSnapshot, pool: PromptPool,
                 decide: Callable[[PoolRequest, Ledger], int]) -> TickResult:
        led = Ledger(cluster)
        out: list[Assignment] = []
        if not any(led.alive):
            return TickResult(assignments=())
        for req in pool.fcfs():
            g = self._target.get(req.request_id)
            if g is None or not led.alive[g]:
                g = decide(req, led)
                self._target[req.request_id] = g
            if led.cap[g] <= 0 or led.kv_room[g] < req.prompt_tokens:
                continue
            led.admit(g, req.prompt_tokens)
            del self._target[req.request_id]
            out.append(Assignment(req.request_id, g, req.prompt_tokens))
        return TickResult(assignments=tuple(out))
