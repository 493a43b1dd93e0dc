"""BR-H: BalanceRoute with a look-ahead over a window of decode steps (docs/design.md,
"BR-H"): by default 800 steps, on a sparse ladder of points, where decode leads the load."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from br_serve.core.ageing import Ageing
from br_serve.core.fscore import horizon_points, point_weights, projected_loads
from br_serve.core.horizon import HorizonMargins
from br_serve.core.options import option
from br_serve.core.policies.br0 import ScalarMargins, TickOptions
from br_serve.core.policy import PolicyBase, PolicyContext, PolicyNeeds, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.predictor import SurvivesWindow, validate_prediction
from br_serve.core.tick import MarginModel, run_two_stage
from br_serve.core.types import ClusterSnapshot, FloatArray, IntArray, TickResult


@dataclass(frozen=True, slots=True)
class Projection:
    """BR-H's view of the window: ``loads`` ``(G, points)`` and whether the predictor
    answered usably (else every request survives the window)."""

    loads: FloatArray
    ok: bool = True


@dataclass(frozen=True, slots=True)
class BRHOptions(TickOptions):
    """The tick's options plus the look-ahead's (BR-0's time-aware stage is not
    among them: brh balances tokens and refuses ``cost`` and its options by name).
    ``horizon=0, alpha=1, beta=None`` is BR-0."""

    horizon: int = option(800, ge=0, le=16384, doc="look-ahead window H in decode steps "
                          "(also the predictor's window); it must reach the lifetimes of "
                          "the requests whose ends unbalance the cluster")
    horizon_step: int | None = option(
        25, ge=1, doc="project at step 0 and a doubling ladder from this step up to "
        "the horizon (each point weighs the window steps nearest to it), instead of at "
        "every step (None): a long window for a few points")
    gamma: float = option(1.0, gt=0, le=1, doc="discount per step of the window")
    alpha: float = option(1.0, gt=0, doc="weight of the fill term")
    beta: float | None = option(None, gt=0, doc="weight of the overflow term (None: the "
                                "number of alive replicas G)")
    gate: float = option(0.5, gt=0, le=1, doc="confidence gate: a request is projected "
                         "to end in the window when p_fin >= gate")
    predictor_timeout_s: float = option(0.01, gt=0, doc="a predictor answer later than "
                                        "this (by the injected clock) is ignored")
    trust_decode_share: float | None = option(
        0.5, ge=0, le=1, doc="per tick, at any pool depth, use BR-0's decision unless "
        "decoded tokens are at least this share of the running load "
        "(the load is made by decode growth and ends, which the look-ahead projects, "
        "rather than by prompts, which BR-0's placement decides; None: no such rule)")


@register_policy("brh")
class BRH(PolicyBase[BRHOptions]):
    """Two-stage tick over horizon margin vectors fed by a termination predictor.

    A predictor that raises, returns a malformed answer, or answers later than
    ``predictor_timeout_s`` (by the injected clock) is ignored for the tick: every
    request is then projected to survive the window (the closed gate).
    """

    Options = BRHOptions
    needs = PolicyNeeds(running_detail=True, predictor=True)

    def __init__(self, options: BRHOptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self.predictor = context.predictor or SurvivesWindow()
        self.clock = context.clock
        self.points = horizon_points(options.horizon, options.horizon_step)
        self.h = self.points.astype(np.float64)
        self.d = point_weights(self.points, options.gamma)
        self.ageing = Ageing(options.ageing_rule())

    def _predict(self, cluster: ClusterSnapshot
                 ) -> tuple[IntArray | None, FloatArray | None, bool]:
        """``(ends, p_fin, ok)``: every running request's projected end step (``None``:
        all survive the window), the predictor's ``p_fin`` and whether it answered
        usably (a failure closes the gate for the tick)."""
        run = cluster.running
        horizon = self.options.horizon
        if isinstance(self.predictor, SurvivesWindow) or len(run) == 0:
            return None, None, True
        t0 = self.clock()
        try:
            pred = self.predictor.predict(run, horizon)
            validate_prediction(pred, len(run))
        except Exception:  # any predictor failure degrades to the closed gate
            return None, None, False
        if self.clock() - t0 > self.options.predictor_timeout_s:
            return None, None, False
        p = np.asarray(pred.p_fin, dtype=np.float64)
        fin = p >= self.options.gate
        if not fin.any():
            return None, p, True
        # ceil(clip(mu, 0, H + 1)) where the gate opens, H + 1 (survives) elsewhere; in
        # place on one copy (the tick's hot path: each numpy call has a fixed cost)
        ends = np.minimum(np.asarray(pred.mu_rem, dtype=np.float64), horizon + 1)
        np.maximum(ends, 0, out=ends)
        np.ceil(ends, out=ends)
        ends[~fin] = horizon + 1  # also where mu_rem is not finite (p_fin below the gate)
        return ends.astype(np.int64), p, True

    def decode_led(self, cluster: ClusterSnapshot) -> bool:
        """Whether decoded tokens are at least ``trust_decode_share`` of the running
        load (always, with the rule off). Where prompts make the load, BR-0's placement
        of the pool's prompts is what balances it, now and at every later refill, and
        the look-ahead adds only its projection's error (docs/core.md)."""
        share = self.options.trust_decode_share
        if share is None:
            return True
        run = cluster.running
        decoded = float(run.decoded_tokens.sum())
        total = decoded + float(run.prompt_tokens.sum())
        return total > 0 and decoded >= share * total

    def projected(self, cluster: ClusterSnapshot) -> Projection:
        """The window's projected loads (a freed slot stays empty) and whether the
        predictor answered usably."""
        ends, _, ok = self._predict(cluster)
        return Projection(self._project(cluster, ends), ok)

    def _project(self, cluster: ClusterSnapshot, ends: IntArray | None) -> FloatArray:
        run = cluster.running
        if len(run) == 0:
            # No per-request detail: each replica's load survives and grows by its count.
            return (cluster.load_tokens[:, None].astype(np.float64)
                    + cluster.running_requests[:, None] * self.h[None, :])
        weight = run.prompt_tokens + run.decoded_tokens
        return projected_loads(run.replica, weight, ends, cluster.num_replicas, self.points)

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        c = self.options
        model: MarginModel
        ok, trusted = True, self.decode_led(cluster)
        if not trusted:  # prompts make the load: BR-0's decision, no predictor needed
            model = ScalarMargins(cluster)
        else:
            ends, _, ok = self._predict(cluster)
            alive_g = int(cluster.alive.sum()) or 1
            beta = float(alive_g) if c.beta is None else c.beta
            model = HorizonMargins(self._project(cluster, ends), cluster.alive, self.d,
                                   c.alpha, beta, self.h)
        res = run_two_stage(
            cluster, pool, model,
            s_greedy=c.resolved_s_greedy(cluster.num_replicas), r_max=c.r_max,
            starving=self.ageing.starving(pool, now_s, tick),
            soft_fill=c.ageing_soft_fill, overdue_band=c.ageing_overdue_band,
            shallow=c.shallow_pool,
            hold_budget_s=c.hold_budget_ms / 1e3,
            hold_min_busy_share=c.hold_min_busy_share,
            hold_min_load_share=c.hold_min_load_share, now_s=now_s)
        self.ageing.record(pool, len(res.assignments), now_s, sum(
            a.prompt_tokens for a in res.assignments))
        if ok and trusted:
            return res
        return res.flagged(ok, trusted)

