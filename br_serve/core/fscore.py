"""The F-score (DESIGN sections 3 and 4) and the quantities it is built from.

Pure numpy / Python. ``F_g(Q) = -dI``: the decrease of the barrier imbalance
``I = G * max_g L_g - sum_g L_g`` when a set of requests with total prompt ``D`` is
admitted to replica ``g``.
"""

from __future__ import annotations

from bisect import bisect_right

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


class HorizonScore:
    """``F(D) = alpha*(1'd)*D - beta*(D*1 - m)_+'d`` for one margin vector ``m``.

    Built once per replica and decision (O(H log H)); each evaluation is then
    O(log H) by bisection over the sorted margins with prefix sums of the weights.
    """

    __slots__ = ("_a", "_beta", "_cw", "_cwm", "_m", "peak")

    def __init__(self, margins: FloatArray, d: FloatArray, alpha: float, beta: float) -> None:
        order = np.argsort(margins, kind="stable")
        m = margins[order]
        w = d[order]
        self._m: list[float] = m.tolist()
        # prefix sums with a leading zero: _cw[j] = sum of w over the j smallest margins
        self._cw: list[float] = [0.0, *np.cumsum(w).tolist()]
        self._cwm: list[float] = [0.0, *np.cumsum(w * m).tolist()]
        self._a = alpha * float(d.sum())
        self._beta = beta
        # Concave, piecewise linear: slope just past the j-th smallest margin is
        # a - beta*cw[j+1]; the maximiser is the first breakpoint where it turns <= 0.
        thresh = self._a / beta
        j = int(np.searchsorted(np.asarray(self._cw[1:]), thresh - 1e-12, side="left"))
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


def projected_loads(
    replica: IntArray,
    weight_tokens: IntArray,
    end_step: IntArray,
    replicas: int,
    horizon: int,
) -> FloatArray:
    """``L_g(h) = sum_{i on g, h < end_i} (w_i + h)`` for ``h = 0..H``, shape ``(G, H+1)``.

    ``end_step[i]`` is the first step at which request ``i`` no longer runs (clipped to
    ``H + 1`` for "survives the window"). Built with difference arrays and one
    ``bincount`` per term, so it costs O(n + G*H) with no per-request Python loop.
    """
    width = horizon + 2
    end = np.clip(end_step, 0, horizon + 1)
    base = replica * width
    n_bins = replicas * width
    w = weight_tokens.astype(np.float64)
    dw = np.bincount(base, weights=w, minlength=n_bins) - np.bincount(
        base + end, weights=w, minlength=n_bins)
    dn = np.bincount(base, minlength=n_bins) - np.bincount(base + end, minlength=n_bins)
    sum_w = np.cumsum(dw.reshape(replicas, width), axis=1)[:, : horizon + 1]
    count = np.cumsum(dn.reshape(replicas, width), axis=1)[:, : horizon + 1]
    h = np.arange(horizon + 1, dtype=np.float64)
    out: FloatArray = sum_w + count * h
    return out
