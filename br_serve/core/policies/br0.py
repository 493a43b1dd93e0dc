"""BR-0: the prediction-free BalanceRoute policy (DESIGN section 3)."""

from __future__ import annotations

import numpy as np

from br_serve.core.config import PolicyConfig
from br_serve.core.fscore import f_score
from br_serve.core.pool import PromptPool
from br_serve.core.registry import PolicyContext, register
from br_serve.core.tick import run_two_stage
from br_serve.core.types import ClusterSnapshot, TickResult


class ScalarScorer:
    """``F(D) = D - G*(D - m)_+`` for one replica's margin ``m``; peaks at ``D = m``."""

    __slots__ = ("g", "peak")

    def __init__(self, margin: float, replicas: int) -> None:
        self.peak = margin
        self.g = replicas

    def __call__(self, d_tokens: float, n_requests: int = 1) -> float:
        return f_score(d_tokens, self.peak, self.g)


class ScalarMargins:
    """Replica loads now, the barrier max ``M`` over alive replicas, margins ``M - L_g``."""

    __slots__ = ("alive", "g", "loads", "max_load")

    def __init__(self, cluster: ClusterSnapshot) -> None:
        self.loads: list[float] = cluster.load_tokens.astype(np.float64).tolist()
        self.alive: list[bool] = cluster.alive.tolist()
        self.g = max(1, sum(self.alive))
        alive_loads = [x for x, a in zip(self.loads, self.alive, strict=True) if a]
        self.max_load = max(alive_loads, default=0.0)

    def rank(self, g: int) -> float:
        return -self.loads[g]  # margin M - L_g, less the common M

    def scorer(self, g: int) -> ScalarScorer:
        return ScalarScorer(self.max_load - self.loads[g], self.g)

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None:
        self.loads[g] += d_tokens
        if self.loads[g] > self.max_load:
            self.max_load = self.loads[g]


class BR0:
    """Two-stage F-score tick over scalar margins."""

    name = "br0"

    def __init__(self, config: PolicyConfig, context: PolicyContext) -> None:
        self.config = config

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        c = self.config
        return run_two_stage(
            cluster, pool, ScalarMargins(cluster),
            s_greedy=c.resolved_s_greedy(cluster.num_replicas), r_max=c.r_max,
            max_wait_s=c.max_wait_s, max_wait_ticks=c.max_wait_ticks,
            max_overtakes=c.max_overtakes, now_s=now_s, tick=tick)


register("br0")(BR0)
