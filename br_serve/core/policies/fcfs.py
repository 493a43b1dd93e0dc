"""Shared FCFS dispatch loop for the replica-choosing baselines (docs/design.md).

The baselines choose a replica, not a request: the pool is walked in arrival order and
each request goes to the replica its rule picks among the *feasible* ones (alive, a
free slot, enough KV room). A request that fits nowhere is skipped this tick.
"""

from __future__ import annotations

from collections.abc import Callable

from br_serve.core.policy import OptionsT, PolicyBase
from br_serve.core.pool import PromptPool
from br_serve.core.types import Assignment, ClusterSnapshot, PoolRequest, TickResult


class Ledger:
    """Per-tick working copy of replica totals, updated as requests are admitted.

    ``inflight[g]`` counts requests admitted to ``g`` during this tick.
    """

    __slots__ = ("alive", "cap", "inflight", "kv_limit", "kv_room", "loads", "running")

    def __init__(self, cluster: ClusterSnapshot) -> None:
        self.loads: list[int] = cluster.load_tokens.tolist()
        self.running: list[int] = cluster.running_requests.tolist()
        self.cap: list[int] = cluster.free_slots.tolist()
        self.kv_limit: list[int] = cluster.kv_limit_tokens.tolist()
        self.kv_room = [k - x for k, x in zip(self.kv_limit, self.loads, strict=True)]
        self.inflight = [0] * len(self.loads)
        self.alive: list[bool] = cluster.alive.tolist()

    def max_alive_load(self) -> int:
        return max((x for x, a in zip(self.loads, self.alive, strict=True) if a), default=0)

    def feasible(self, prompt_tokens: int) -> list[int]:
        return [g for g, c in enumerate(self.cap) if c > 0 and self.kv_room[g] >= prompt_tokens]

    def admit(self, g: int, prompt_tokens: int) -> None:
        self.cap[g] -= 1
        self.kv_room[g] -= prompt_tokens
        self.loads[g] += prompt_tokens
        self.running[g] += 1
        self.inflight[g] += 1


Chooser = Callable[[PoolRequest, list[int], Ledger], int]


def fcfs_dispatch(cluster: ClusterSnapshot, pool: PromptPool, choose: Chooser) -> TickResult:
    """Assign pool requests in arrival order with ``choose(req, feasible, ledger)``."""
    led = Ledger(cluster)
    total = sum(led.cap)
    out: list[Assignment] = []
    for req in pool.fcfs():
        if total <= 0:
            break
        feas = led.feasible(req.prompt_tokens)
        if not feas:
            continue
        g = choose(req, feas, led)
        led.admit(g, req.prompt_tokens)
        total -= 1
        out.append(Assignment(req.request_id, g, req.prompt_tokens))
    return TickResult(assignments=tuple(out))


class FCFSPolicy(PolicyBase[OptionsT]):
    """A policy that walks the pool FCFS and only chooses the replica (:meth:`choose`)."""

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        """One of ``feasible`` (non-empty) for ``req``, given this tick's ledger."""
        raise NotImplementedError

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        return fcfs_dispatch(cluster, pool, self.choose)


