"""BR-0: the prediction-free BalanceRoute policy (docs/design.md, "BR-0")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from br_serve.core.fscore import f_score
from br_serve.core.options import Options, option
from br_serve.core.policy import PolicyBase, PolicyNeeds, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.tick import run_two_stage
from br_serve.core.types import ClusterSnapshot, TickResult


@dataclass(frozen=True, slots=True)
class BR0Options(Options):
    """Options of the two-stage tick (shared by BR-H, which extends them).

    Ageing: a pool request is assigned first when it has waited longer than
    ``max_wait_s`` or ``max_wait_ticks`` *and* at least ``max_overtakes`` newer
    requests have left the pool before it (docs/core.md explains why both).
    """

    s_greedy: int | None = option(
        None, ge=0, doc="Stage 1 runs while more than this many slots are free "
        "(None: the number of alive replicas G)")
    r_max: int = option(4, ge=1, le=10, doc="Stage 2 candidates per replica (2^r_max - 1 "
                        "subsets are enumerated)")
    max_wait_s: float = option(2.0, gt=0, doc="ageing: seconds in the pool before a "
                               "request may be forced")
    max_wait_ticks: int = option(32, ge=1, doc="ageing: ticks in the pool before a request "
                                 "may be forced")
    max_overtakes: int = option(1024, ge=0, doc="ageing: newer requests that must have "
                                "left the pool before it")

    def resolved_s_greedy(self, replicas: int) -> int:
        return replicas if self.s_greedy is None else self.s_greedy


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


@register_policy("br0")
class BR0(PolicyBase[BR0Options]):
    """Two-stage F-score tick over scalar margins."""

    Options = BR0Options
    needs = PolicyNeeds()

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        c = self.options
        return run_two_stage(
            cluster, pool, ScalarMargins(cluster),
            s_greedy=c.resolved_s_greedy(cluster.num_replicas), r_max=c.r_max,
            max_wait_s=c.max_wait_s, max_wait_ticks=c.max_wait_ticks,
            max_overtakes=c.max_overtakes, now_s=now_s, tick=tick)

