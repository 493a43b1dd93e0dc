"""BR-H: BalanceRoute with a short-horizon look-ahead (docs/design.md, "BR-H")."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from br_serve.core.ageing import Ageing
from br_serve.core.fscore import HorizonScore, discount_weights, projected_loads
from br_serve.core.options import ConfigError, option
from br_serve.core.policies.br0 import BR0Options, ScalarMargins
from br_serve.core.policy import PolicyBase, PolicyContext, PolicyNeeds, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.predictor import SurvivesWindow, validate_prediction
from br_serve.core.projection import Projection, refill_arrays, refill_rollout
from br_serve.core.tick import MarginModel, run_two_stage
from br_serve.core.types import ClusterSnapshot, FloatArray, IntArray, TickResult


@dataclass(frozen=True, slots=True)
class BRHOptions(BR0Options):
    """BR-0's options plus the look-ahead's. ``horizon=0, alpha=1, beta=None`` is BR-0."""

    horizon: int = option(80, ge=0, le=4096, doc="look-ahead window H in decode steps "
                          "(also the predictor's window)")
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
        0.5, ge=0, doc="per tick in a pool deeper than the free slots, use BR-0's "
        "decision unless the window projects drops of which the pool can refill less "
        "than this share (refill_coverage; None: always look ahead)")
    max_refills: int | None = option(None, ge=0, doc="with refill: at most this many "
                                     "refills per tick (None: as many as the pool holds)")

    def check(self) -> None:
        if self.cost != "tokens":
            raise ConfigError(f"cost: brh balances tokens only so far (got {self.cost!r}); "
                              "use br0 for cost='time'")


class GrowingScore:
    """BR-H score of one replica counting the admitted requests' own growth.

    Admitting ``n`` requests of total prompt ``D`` adds ``D + n*h`` to the replica's
    load at step ``h``, so ``F_n(D) = alpha*sum_h d_h (D + n h)
    - beta*sum_h d_h (D + n h - m(h))_+``: the paper's score with margins ``m - n*h`` and
    a constant ``alpha*n*sum_h d_h h``. With ``alpha = 1, beta = G`` it is exactly
    ``-sum_h d_h dI(h)``. Leaving the growth out made BR-H overfill replicas with a free
    slot (their margins grow with ``h`` only until the new request starts growing too):
    measured, imbalance rose with ``H`` even with the gate closed (docs/core.md).
    ``peak`` is the single-request peak (``n = 1``).
    """

    __slots__ = ("_args", "_bonus1", "_margins", "_one", "_parts", "peak")

    def __init__(self, margins: FloatArray, h: FloatArray, d: FloatArray, alpha: float,
                 beta: float, uniform: bool, dh: float, fill: float | None = None) -> None:
        # ``fill`` (with refills): the total fill weight, ``d`` the overflow weights
        # and ``dh`` the fill weights' ``sum_h u_h h``; see RefillMargins.
        self._margins = margins
        self._args = (h, d, alpha, beta, uniform, dh, fill)
        self._parts: dict[int, tuple[HorizonScore, float]] = {}
        self._one, self._bonus1 = self._part(1)  # the common case, kept at hand
        self.peak = self._one.peak

    def _part(self, n: int) -> tuple[HorizonScore, float]:
        part = self._parts.get(n)
        if part is None:
            h, d, alpha, beta, uniform, dh, fill = self._args
            part = (HorizonScore(self._margins - n * h, d, alpha, beta, uniform, fill),
                    alpha * n * dh)
            self._parts[n] = part
        return part

    def __call__(self, d_tokens: float, n_requests: int = 1) -> float:
        if n_requests == 1:
            return self._one(d_tokens) + self._bonus1
        sc, bonus = self._part(n_requests)
        return sc(d_tokens) + bonus


class HorizonMargins:
    """Projected loads ``L_g(h)``, envelope ``M(h)`` and margin vectors ``M - L_g``.

    Scorers are cached per replica and dropped when an admission changes what they
    depend on (the replica's own loads, or the envelope).
    """

    __slots__ = ("_cache", "alive", "alpha", "beta", "d", "dh", "h", "ld", "loads", "top",
                 "uniform")

    def __init__(self, loads: FloatArray, alive: np.ndarray, d: FloatArray, alpha: float,
                 beta: float) -> None:
        self.loads = loads
        self.alive = alive
        self.d = d
        self.alpha = alpha
        self.beta = beta
        self.h = np.arange(d.shape[0], dtype=np.float64)
        self.dh = float(d @ self.h)
        self.uniform = bool((d == 1.0).all())
        self.top: FloatArray = (loads[alive].max(axis=0) if alive.any()
                                else np.zeros(d.shape[0]))
        self.ld: list[float] = (loads @ d).tolist()
        self._cache: dict[int, GrowingScore] = {}

    def rank(self, g: int) -> float:
        return -self.ld[g]  # discounted margin (M - L_g)'d, less the common M'd

    def scorer(self, g: int) -> GrowingScore:
        sc = self._cache.get(g)
        if sc is None:
            sc = GrowingScore(self.top - self.loads[g], self.h, self.d, self.alpha, self.beta,
                              self.uniform, self.dh)
            self._cache[g] = sc
        return sc

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None:
        row = self.loads[g]
        row += d_tokens + n_requests * self.h  # new requests grow like the others
        self.ld[g] = float(row.sum() if self.uniform else row @ self.d)
        if (row > self.top).any():
            np.maximum(self.top, row, out=self.top)
            self._cache.clear()
        else:
            self._cache.pop(g, None)


class RefillMargins(HorizonMargins):
    """:class:`HorizonMargins` over a projection with refills (core/projection.py).

    ``target`` are the projected loads with every rollout refill, ``base`` the same with
    each replica's own refills at ``min_prompt`` (the least a refill can bring). Past a
    replica's first refill ``f_g`` an admission displaces its refill: its load there is
    ``max(target, base + D + n h)``, so the score of ``g`` weighs the fill
    ``alpha * d_h`` before ``f_g`` only, and the overflow past the margin ``top - base``
    by ``beta * d_h`` before ``f_g`` and ``(beta - alpha) * d_h`` after (the displaced
    refill no longer fills: an overflowing admission adds ``(G - 1)`` times its excess
    to the imbalance, not ``G``). With no refill on ``g`` it is :class:`GrowingScore`.
    """

    __slots__ = ("base", "first")

    def __init__(self, target: FloatArray, base: FloatArray, first: list[int],
                 alive: np.ndarray, d: FloatArray, alpha: float, beta: float) -> None:
        super().__init__(target, alive, d, alpha, beta)
        self.base = base
        self.first = first

    def scorer(self, g: int) -> GrowingScore:
        sc = self._cache.get(g)
        if sc is None:
            f = self.first[g]
            m = self.top - self.base[g]
            if f >= self.d.shape[0]:
                sc = GrowingScore(m, self.h, self.d, self.alpha, self.beta, self.uniform,
                                  self.dh)
            else:
                w = self.d.copy()
                w[f:] *= 1.0 - self.alpha / self.beta
                fill = self.alpha * float(self.d[:f].sum())
                dh = float(self.d[:f] @ self.h[:f])
                sc = GrowingScore(m, self.h, w, self.alpha, self.beta, False, dh, fill)
            self._cache[g] = sc
        return sc

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None:
        b = self.base[g]
        b += d_tokens + n_requests * self.h
        row = self.loads[g]
        np.maximum(row, b, out=row)
        self.ld[g] = float(row @ self.d)
        if (row > self.top).any():
            np.maximum(self.top, row, out=self.top)
            self._cache.clear()
        else:
            self._cache.pop(g, None)


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
        self.d = discount_weights(options.horizon, options.gamma)
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
        mu = np.asarray(pred.mu_rem, dtype=np.float64)
        ends = np.full(len(run), horizon + 1, dtype=np.int64)
        ends[fin] = np.ceil(np.clip(mu[fin], 0, horizon + 1))
        return ends, p, True

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
        """Shallow-pool mode is on and the pool fits the free slots (always look ahead)."""
        return self.options.shallow_pool and len(pool) <= int(cluster.free_slots.sum())

    def trusted(self, cluster: ClusterSnapshot, pool: PromptPool, ends: IntArray | None,
                p_fin: FloatArray | None) -> bool:
        """Whether this tick looks ahead (else it makes BR-0's decision; docs/core.md).

        A shallow pool (it fits the free slots) cannot refill what the window frees, so
        the projection (drops and growth) is right there: always. In a deeper pool the
        look-ahead is used when it projects drops the pool cannot refill
        (:meth:`refill_coverage` below ``trust_refill_coverage``); with no projected drop
        every replica just grows, which BR-0 sees as well.
        """
        threshold = self.options.trust_refill_coverage
        if threshold is None:
            return True
        if self.shallow(cluster, pool):
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
            h = np.arange(horizon + 1, dtype=np.float64)
            return Projection(cluster.load_tokens[:, None].astype(np.float64)
                              + cluster.running_requests[:, None] * h[None, :], ok)
        weight = run.prompt_tokens + run.decoded_tokens
        loads = projected_loads(run.replica, weight, ends, g, horizon)
        if c.refill == "none" or ends is None or pool is None or not len(pool):
            return Projection(loads, ok)
        refills = refill_rollout(run.replica, weight, ends, cluster.alive.tolist(), horizon,
                                 pool.sorted_sizes, c.max_refills)
        if not refills:
            return Projection(loads, ok)
        r_loads, r_prompts, r_counts, first = refill_arrays(refills, g, horizon)
        loads += r_loads
        if not c.absorb:
            return Projection(loads, ok, refills=len(refills))
        base = loads - r_prompts + float(pool.sorted_sizes[0]) * r_counts
        return Projection(loads, ok, base, first, len(refills))

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        c = self.options
        threshold = c.trust_refill_coverage
        if (threshold is not None and threshold <= 1.0
                and not isinstance(self.predictor, SurvivesWindow)  # nothing to skip
                and not self.shallow(cluster, pool)
                and self.pool_refills_any_drop(cluster, pool)):
            # the trust rule's answer is known without the predictor: BR-0's decision
            ends, p_fin, ok, trusted = None, None, True, False
        else:
            ends, p_fin, ok = self._predict(cluster)
            trusted = self.trusted(cluster, pool, ends, p_fin)
        model: MarginModel
        if not trusted:  # the pool refills what the window drops: BR-0's decision
            model = ScalarMargins(cluster)
        else:
            proj = self._project(cluster, pool, ends, ok)
            alive_g = int(cluster.alive.sum()) or 1
            beta = float(alive_g) if c.beta is None else c.beta
            if proj.base is not None and proj.first is not None:
                model = RefillMargins(proj.loads, proj.base, proj.first, cluster.alive,
                                      self.d, c.alpha, beta)
            else:
                model = HorizonMargins(proj.loads, cluster.alive, self.d, c.alpha, beta)
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

