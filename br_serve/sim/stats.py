"""Small-sample statistics for paired replay ensembles (no scipy dependency).

A comparison of policy A against baseline B over K paired replays uses the K per-replay
values ``d_r`` (e.g. the gain ``thr_A,r / thr_B,r - 1``): mean, standard error
``sd(d) / sqrt(K)`` (``ddof = 1``) and the two-sided 95% Student t-interval
``mean +- t_{0.975, K-1} * se``. With K = 1 there is no spread: s.e. and interval are
``None``. The t quantile is computed here (regularised incomplete beta function,
bisection), exact to ~1e-10, and checked against the printed tables in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
          + a * math.log(x) + b * math.log1p(-x))
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``0 < p < 1``, ``df > 0``), by bisection."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0 (got p={p}, df={df})")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True, slots=True)
class Paired:
    """Mean, standard error and 95% t-interval of K per-replay values.

    ``se`` and ``ci95`` are ``None`` for K < 2. ``tie`` is True when the interval holds
    0 (the difference is not distinguishable from none at the 95% level); with K < 2
    nothing can be told apart, so ``tie`` is True too.
    """

    mean: float
    se: float | None
    ci95: tuple[float, float] | None
    n: int

    @property
    def tie(self) -> bool:
        return self.ci95 is None or self.ci95[0] <= 0.0 <= self.ci95[1]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form the benches write: ``{"mean", "ci95": [lo, hi] | None, "n"}``."""
        return {"mean": self.mean, "ci95": list(self.ci95) if self.ci95 else None,
                "n": self.n}


def paired(values: Sequence[float]) -> Paired:
    """:class:`Paired` statistics of ``values`` (one per replay, already paired).

    Raises:
        ValueError: no values, or a non-finite one.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("paired: no values")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"paired: non-finite value in {xs}")
    k = len(xs)
    mean = math.fsum(xs) / k
    if k < 2:
        return Paired(mean, None, None, k)
    var = math.fsum((x - mean) ** 2 for x in xs) / (k - 1)
    se = math.sqrt(var / k)
    half = t_quantile(0.975, k - 1) * se
    return Paired(mean, se, (mean - half, mean + half), k)
