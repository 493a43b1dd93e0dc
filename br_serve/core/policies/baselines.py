"""The paper's baselines: ``random``, ``round_robin``, ``jsq``, ``p2c`` (FCFS pool order)."""

from __future__ import annotations

from br_serve.core.config import PolicyConfig
from br_serve.core.policies.fcfs import Ledger, fcfs_dispatch
from br_serve.core.pool import PromptPool
from br_serve.core.registry import PolicyContext, register
from br_serve.core.types import ClusterSnapshot, PoolRequest, TickResult


class _Base:
    name = ""

    def __init__(self, config: PolicyConfig, context: PolicyContext) -> None:
        self.config = config
        self.rng = context.rng

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        raise NotImplementedError

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        return fcfs_dispatch(cluster, pool, self.choose)


@register("random")
class RandomPolicy(_Base):
    """Uniformly random feasible replica (injected generator)."""

    name = "random"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        return feasible[int(self.rng.integers(len(feasible)))]


@register("round_robin")
class RoundRobin(_Base):
    """Next feasible replica after the last one chosen, cycling over all replicas."""

    name = "round_robin"

    def __init__(self, config: PolicyConfig, context: PolicyContext) -> None:
        super().__init__(config, context)
        self._next = 0

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        g_all = len(led.cap)
        g = min(feasible, key=lambda r: (r - self._next) % g_all)
        self._next = (g + 1) % g_all
        return g


@register("jsq")
class JoinShortestQueue(_Base):
    """Fewest running requests (counting this tick's admissions); ties: lowest index."""

    name = "jsq"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        return min(feasible, key=lambda g: (led.running[g], g))


@register("p2c")
class PowerOfTwo(_Base):
    """Two distinct random feasible replicas; the one with fewer running requests."""

    name = "p2c"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        if len(feasible) == 1:
            return feasible[0]
        i, j = self.rng.choice(len(feasible), size=2, replace=False)
        a, b = feasible[int(i)], feasible[int(j)]
        return a if (led.running[a], a) <= (led.running[b], b) else b
