"""The paper's baselines: ``random``, ``round_robin``, ``jsq``, ``p2c`` (FCFS pool order)."""

from __future__ import annotations

from br_serve.core.options import NoOptions
from br_serve.core.policies.fcfs import FCFSPolicy, Ledger
from br_serve.core.policy import PolicyContext, register_policy
from br_serve.core.types import PoolRequest


@register_policy("random")
class RandomPolicy(FCFSPolicy[NoOptions]):
    """Uniformly random feasible replica (injected generator)."""

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        return feasible[int(self.context.rng.integers(len(feasible)))]


@register_policy("round_robin")
class RoundRobin(FCFSPolicy[NoOptions]):
    """Next feasible replica after the last one chosen, cycling over all replicas."""

    def __init__(self, options: NoOptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self._next = 0

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        g_all = len(led.cap)
        g = min(feasible, key=lambda r: (r - self._next) % g_all)
        self._next = (g + 1) % g_all
        return g


@register_policy("jsq")
class JoinShortestQueue(FCFSPolicy[NoOptions]):
    """Fewest running requests (counting this tick's admissions); ties: lowest index."""

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        return min(feasible, key=lambda g: (led.running[g], g))


@register_policy("p2c")
class PowerOfTwo(FCFSPolicy[NoOptions]):
    """Two distinct random feasible replicas; the one with fewer running requests."""

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        if len(feasible) == 1:
            return feasible[0]
        i, j = self.context.rng.choice(len(feasible), size=2, replace=False)
        a, b = feasible[int(i)], feasible[int(j)]
        return a if (led.running[a], a) <= (led.running[b], b) else b
