"""BR-H: BalanceRoute with a look-ahead over a window of decode steps (docs/design.md,
"BR-H"): by default 800 steps, on a sparse ladder of points, where decode leads the load."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from br_serve.core.ageing import Ageing
from br_serve.core.fscore import horizon_points, point_weights, projected_loads
from br_serve.core.horizon import HorizonMargins, RefillMargins
from br_serve.core.options import option
from br_serve.core.policies.br0 import ScalarMargins, TickOptions
from br_serve.core.policy import PolicyBase, PolicyContext, PolicyNeeds, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.predictor import SurvivesWindow, validate_prediction
from br_serve.core.projection import Projection, refill_arrays, refill_rollout
from br_serve.core.tick import MarginModel, run_two_stage
from br_serve.core.types import ClusterSnapshot, FloatArray, IntArray, TickResult


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
    refill: Literal["none", "rollout"] = option(
        "none", doc="how a freed slot is projected: none (stays empty), rollout (BR-0's "
        "choice from the pool, without replacement; core/projection.py)")
    absorb: bool = option(True, doc="with refill: an admission displaces the replica's "
                          "own projected refill")
    trust_refill_coverage: float | None = option(
        None, ge=0, doc="per tick in a pool deeper than the free slots, use BR-0's "
        "decision unless the window projects drops of which the pool can refill less "
        "than this share (refill_coverage; None: no such rule)")
    trust_decode_share: float | None = option(
        0.5, ge=0, le=1, doc="per tick, at any pool depth, use BR-0's decision unless "
        "decoded tokens are at least this share of the running load "
        "(the load is made by decode growth and ends, which the look-ahead projects, "
        "rather than by prompts, which BR-0's placement decides; None: no such rule)")
    max_refills: int | None = option(None, ge=0, doc="with refill: at most this many "
                                     "refills per tick (None: as many as the pool holds)")


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

    def refill_coverage(self, cluster: ClusterSnapshot, pool: PromptPool,
                        ends: IntArray | None, p_fin: FloatArray | None) -> float:
        """The share of the window's projected drops the pool can refill (docs/core.md).

        The ``k`` requests projected to end in the window drop their load at the end
        (``prompt + decoded + end``, weighted by ``p_fin``); the largest drop is matched
        with the pool's largest prompt, the next with the next, and each refill covers
        at most its drop: ``sum_i min(drop_i, prompt_i) / sum_i drop_i``. 0 when nothing
        ends in the window or the pool is empty (a refill needs a waiting request).
        """
        if ends is None or p_fin is None or not len(pool):
            return 0.0
        fin = np.flatnonzero(ends <= self.options.horizon)
        if fin.size == 0:
            return 0.0
        run = cluster.running
        drops: list[float] = (p_fin[fin] * (run.prompt_tokens[fin] + run.decoded_tokens[fin]
                                            + ends[fin])).tolist()
        drops.sort(reverse=True)  # a handful per tick: plain Python beats numpy here
        total = sum(drops)  # summed in the order of ``covered``: all covered is exactly 1
        if total <= 0:
            return 1.0
        sizes = pool.sorted_sizes
        last = len(sizes) - 1
        covered = sum(min(x, sizes[last - j]) for j, x in enumerate(drops[: last + 1]))
        return covered / total

    def pool_refills_any_drop(self, cluster: ClusterSnapshot, pool: PromptPool) -> bool:
        """Whether :meth:`refill_coverage` is 1 whatever the predictor answers, so a
        tick can skip asking it (docs/core.md, "trust rule").

        A drop is at most ``prompt + decoded + H`` (``p_fin <= 1``, an end in the
        window). If the pool's ``j``-th largest prompt is at least the ``j``-th largest
        such bound over *all* running requests, for every ``j``, then it is at least
        the ``j``-th largest drop of any subset that ends, each refill covers its whole
        drop, and the coverage is 1. Cheap where it matters (a deep pool of prompts as
        large as the running loads); the largest pair is compared first.
        """
        run = cluster.running
        n = len(run)
        sizes = pool.sorted_sizes
        if n == 0 or len(sizes) < n:
            return False
        bound = run.prompt_tokens + run.decoded_tokens + self.options.horizon
        if int(bound.max()) > sizes[-1]:
            return False
        # Bounds up to the n-th largest prompt are paired with a prompt at least that
        # large whatever their rank: only the k above it need pairing, with the top k.
        big = bound[bound > sizes[-n]]
        k = int(big.shape[0])
        if k == 0:
            return True
        need = np.sort(big).tolist()  # ascending, like the pool's: pair index by index
        return all(map(operator.ge, sizes[-k:], need))

    def shallow(self, cluster: ClusterSnapshot, pool: PromptPool) -> bool:
        """Shallow-pool mode is on and the pool fits the free slots (where decode leads,
        always look ahead)."""
        if not self.options.shallow_pool or len(pool) > int(cluster.slots.sum()):
            return False  # deeper than every slot could be free (without summing them)
        return len(pool) <= int(cluster.free_slots.sum())

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

    def _covered(self, shallow: bool, cluster: ClusterSnapshot, pool: PromptPool,
                 ends: IntArray | None, p_fin: FloatArray | None) -> bool:
        """Whether a tick where decode leads the load (:meth:`decode_led`) looks ahead,
        by pool depth (else it makes BR-0's decision; docs/core.md).

        A shallow pool (it fits the free slots) cannot refill what the window frees, so
        the projection (drops and growth) is right there: always; in a deeper pool,
        with ``trust_refill_coverage``, only when the window projects drops the pool
        cannot refill (:meth:`refill_coverage` below it; with no projected drop every
        replica just grows, which BR-0 sees as well).
        """
        if shallow:
            return True
        threshold = self.options.trust_refill_coverage
        if threshold is None:
            return True
        if ends is None:
            return False
        return self.refill_coverage(cluster, pool, ends, p_fin) < threshold

    def projected(self, cluster: ClusterSnapshot, pool: PromptPool | None = None
                  ) -> Projection:
        """The window's projected loads (with ``refill`` and a pool: its refills)."""
        ends, _, ok = self._predict(cluster)
        return self._project(cluster, pool, ends, ok)

    def _project(self, cluster: ClusterSnapshot, pool: PromptPool | None,
                 ends: IntArray | None, ok: bool) -> Projection:
        c = self.options
        g, horizon = cluster.num_replicas, c.horizon
        run = cluster.running
        if len(run) == 0:
            # No per-request detail: each replica's load survives and grows by its count.
            return Projection(cluster.load_tokens[:, None].astype(np.float64)
                              + cluster.running_requests[:, None] * self.h[None, :], ok)
        weight = run.prompt_tokens + run.decoded_tokens
        loads = projected_loads(run.replica, weight, ends, g, self.points)
        if c.refill == "none" or ends is None or pool is None or not len(pool):
            return Projection(loads, ok)
        refills = refill_rollout(run.replica, weight, ends, cluster.alive.tolist(), horizon,
                                 pool.sorted_sizes, c.max_refills)
        if not refills:
            return Projection(loads, ok)
        r_loads, r_prompts, r_counts, first = refill_arrays(refills, g, horizon)
        if self.points.shape[0] != horizon + 1:  # a sparse ladder: read it at the points
            pts = self.points
            r_loads, r_prompts, r_counts = r_loads[:, pts], r_prompts[:, pts], r_counts[:, pts]
            first = np.searchsorted(pts, first, side="left").tolist()
        loads += r_loads
        if not c.absorb:
            return Projection(loads, ok, refills=len(refills))
        base = loads - r_prompts + float(pool.sorted_sizes[0]) * r_counts
        return Projection(loads, ok, base, first, len(refills))

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        c = self.options
        threshold = c.trust_refill_coverage
        shallow = self.shallow(cluster, pool)
        if not self.decode_led(cluster):
            # prompts make the load: BR-0's decision, no predictor needed
            ends, p_fin, ok, trusted = None, None, True, False
        elif (not shallow and threshold is not None and threshold <= 1.0
                and not isinstance(self.predictor, SurvivesWindow)  # nothing to skip
                and self.pool_refills_any_drop(cluster, pool)):
            # the trust rule's answer is known without the predictor: BR-0's decision
            ends, p_fin, ok, trusted = None, None, True, False
        else:
            ends, p_fin, ok = self._predict(cluster)
            trusted = self._covered(shallow, cluster, pool, ends, p_fin)
        model: MarginModel
        if not trusted:  # the pool refills what the window drops: BR-0's decision
            model = ScalarMargins(cluster)
        else:
            proj = self._project(cluster, pool, ends, ok)
            alive_g = int(cluster.alive.sum()) or 1
            beta = float(alive_g) if c.beta is None else c.beta
            if proj.base is not None and proj.first is not None:
                model = RefillMargins(proj.loads, proj.base, proj.first, cluster.alive,
                                      self.d, c.alpha, beta, self.h)
            else:
                model = HorizonMargins(proj.loads, cluster.alive, self.d, c.alpha, beta,
                                       self.h)
        res = run_two_stage(
            cluster, pool, model,
            s_greedy=c.resolved_s_greedy(cluster.num_replicas), r_max=c.r_max,
            starving=self.ageing.starving(pool, now_s, tick),
            soft_fill=c.ageing_soft_fill, shallow=c.shallow_pool,
            hold_budget_s=c.hold_budget_ms / 1e3, now_s=now_s)
        self.ageing.record(pool, len(res.assignments), now_s)
        if ok and trusted:
            return res
        return res.flagged(ok, trusted)

