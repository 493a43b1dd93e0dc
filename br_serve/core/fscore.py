"""The F-score (docs/design.md, "BR-0" and "BR-H") and the quantities it is built from.

Pure numpy / Python. ``F_g(Q) = -dI``: the decrease of the barrier imbalance
``I = G * max_g L_g - sum_g L_g`` when a set of requests with total prompt ``D`` is
admitted to replica ``g``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache
from itertools import accumulate
from operator import mul

import numpy as np
import numpy.typing as npt

from br_serve.core.types import FloatArray, IntArray


def imbalance_tokens(loads: npt.ArrayLike) -> float:
    """``I = G * max(L) - sum(L)`` over the given (alive) replica loads."""
    arr = np.asarray(loads, dtype=np.float64)
    return float(arr.shape[0] * arr.max() - arr.sum()) if arr.size else 0.0


def f_score(d_tokens: float, margin_tokens: float, replicas: int) -> float:
    """BR-0 score ``D - G * (D - m)_+``: slope +1 inside the margin, -(G-1) past it."""
    over = d_tokens - margin_tokens
    return d_tokens - replicas * over if over > 0 else d_tokens


def discount_weights(horizon: int, gamma: float) -> FloatArray:
    """``d = (1, gamma, ..., gamma^H)``."""
    return np.power(gamma, np.arange(horizon + 1, dtype=np.float64))


@lru_cache(maxsize=64)
def _count_prefix_cached(n: int) -> tuple[float, ...]:
    return tuple(float(i) for i in range(n + 1))


def _count_prefix(n: int) -> list[float]:
    return list(_count_prefix_cached(n))


class HorizonScore:
    """``F(D) = alpha*(1'd)*D - beta*(D*1 - m)_+'d`` for one margin vector ``m``.

    Built once per replica and decision (O(H log H)); each evaluation is then
    O(log H) by bisection over the sorted margins with prefix sums of the weights.
    """

    __slots__ = ("_a", "_beta", "_cw", "_cwm", "_m", "peak")

    def __init__(self, margins: FloatArray | list[float], d: FloatArray | list[float],
                 alpha: float, beta: float, uniform: bool = False) -> None:
        # ``uniform`` (gamma == 1, every d_h == 1): a plain sort, and the weight prefix
        # sums are just 0, 1, 2, ...; the tick builds one of these per decision, so the
        # constant factor matters: plain Python on lists (BR-H's margin models pass
        # lists; a window of a few points costs less without numpy's per-call overhead).
        m_in = margins if isinstance(margins, list) else np.asarray(margins).tolist()
        if uniform:
            m_l = sorted(m_in)
            self._cw: list[float] = _count_prefix(len(m_l))
            self._cwm: list[float] = [0.0, *accumulate(m_l)]
        else:
            d_in = d if isinstance(d, list) else np.asarray(d).tolist()
            order = sorted(range(len(m_in)), key=m_in.__getitem__)
            m_l = [m_in[i] for i in order]
            w_l = [d_in[i] for i in order]
            # prefix sums with a leading zero: _cw[j] = weight of the j smallest margins
            self._cw = [0.0, *accumulate(w_l)]
            self._cwm = [0.0, *accumulate(map(mul, w_l, m_l))]
        self._m: list[float] = m_l
        total = float(len(m_l)) if uniform else self._cw[-1]
        self._a = alpha * total
        self._beta = beta
        # Concave, piecewise linear: slope just past the j-th smallest margin is
        # a - beta*cw[j+1]; the maximiser is the first breakpoint where it turns <= 0.
        j = bisect_left(self._cw, self._a / beta - 1e-12, 1) - 1
        self.peak: float = self._m[j] if j < len(self._m) else float("inf")

    def __call__(self, d_tokens: float) -> float:
        j = bisect_right(self._m, d_tokens)  # margins strictly below D overflow...
        # ...margins equal to D contribute (D - m)_+ = 0 either way.
        return self._a * d_tokens - self._beta * (d_tokens * self._cw[j] - self._cwm[j])

    def many(self, d_tokens: FloatArray) -> FloatArray:
        m = np.asarray(self._m)
        j = np.searchsorted(m, d_tokens, side="right")
        cw = np.asarray(self._cw)[j]
        cwm = np.asarray(self._cwm)[j]
        out: FloatArray = self._a * d_tokens - self._beta * (d_tokens * cw - cwm)
        return out


def horizon_points(horizon: int, first_step: int | None = None) -> IntArray:
    """The steps of the window BR-H projects at: ``0..H`` every step (``first_step``
    None), or ``0`` and a doubling ladder ``first_step, 2 first_step, 4 first_step, ...``
    ending at ``H`` (sparse: a long window for a few points)."""
    if first_step is None or horizon == 0:
        return np.arange(horizon + 1, dtype=np.int64)
    pts = [0]
    x = first_step
    while x < horizon:
        pts.append(x)
        x *= 2
    pts.append(horizon)
    return np.array(pts, dtype=np.int64)


def point_weights(points: IntArray, gamma: float) -> FloatArray:
    """Each projection point's weight: ``sum gamma^h`` over the window steps nearest to it
    (a step halfway between two points goes to the later one). On every step of the
    window this is exactly :func:`discount_weights`; on a sparse ladder each point
    stands for the steps around it, so the score still sums over the whole window."""
    pts = np.asarray(points, dtype=np.int64)
    lo = np.empty_like(pts)
    lo[0] = 0
    lo[1:] = (pts[:-1] + pts[1:] + 1) // 2
    hi = np.append(lo[1:], pts[-1] + 1)
    if gamma == 1.0:
        return (hi - lo).astype(np.float64)
    g = float(gamma)
    out: FloatArray = (np.power(g, lo.astype(np.float64))
                       - np.power(g, hi.astype(np.float64))) / (1.0 - g)
    return out


def projected_loads(
    replica: IntArray,
    weight_tokens: IntArray,
    end_step: IntArray | None,
    replicas: int,
    points: int | IntArray,
) -> FloatArray:
    """``L_g(h) = sum_{i on g, h < end_i} (w_i + h)`` at the projection points ``h``
    (``points``: an ascending step array starting at 0, or an int ``H`` for every step
    ``0..H``), shape ``(G, len(points))``.

    ``end_step[i]`` is the first step at which request ``i`` no longer runs; values
    above the last point (or ``end_step=None`` for all) mean "survives the window".
    Survivors contribute ``W_g + N_g*h`` in closed form; only in-window finishers go
    through difference arrays over the points, so the common closed-gate case costs two
    ``bincount`` calls and there is no per-request Python loop either way.
    """
    pts = (np.arange(points + 1, dtype=np.int64) if isinstance(points, int)
           else np.asarray(points, dtype=np.int64))
    h = pts.astype(np.float64)
    last = int(pts[-1])
    w = weight_tokens.astype(np.float64)
    if end_step is None or bool((end_step > last).all()):
        sw = np.bincount(replica, weights=w, minlength=replicas)
        sn = np.bincount(replica, minlength=replicas).astype(np.float64)
        out: FloatArray = sw[:, None] + sn[:, None] * h[None, :]
        return out
    assert end_step is not None
    k = pts.shape[0]
    width = k + 1
    # a request runs at the points strictly before its end: the first idx of them
    idx = (np.clip(end_step, 0, last + 1) if k == last + 1
           else np.searchsorted(pts, end_step, side="left"))
    # One bincount for the four difference arrays (each call has a fixed cost): the
    # weights enter at a request's replica row and leave at its end, the counts the
    # same in a second block of bins.
    m = replica.shape[0]
    n_bins = replicas * width
    bins = np.empty(4 * m, dtype=np.int64)
    np.multiply(replica, width, out=bins[:m])
    np.add(bins[:m], idx, out=bins[m:2 * m])
    np.add(bins[:2 * m], n_bins, out=bins[2 * m:])
    wts = np.empty(4 * m, dtype=np.float64)
    wts[:m] = w
    np.negative(w, out=wts[m:2 * m])
    wts[2 * m:3 * m] = 1.0
    wts[3 * m:] = -1.0
    diff = np.bincount(bins, weights=wts, minlength=2 * n_bins)
    run = np.cumsum(diff.reshape(2, replicas, width), axis=2)[:, :, :k]
    out = run[0] + run[1] * h
    return out
