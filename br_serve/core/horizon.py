"""BR-H's margin models: projected loads over the window's points, scored with growth.

:class:`HorizonMargins` holds the projected loads ``L_g(h)`` at the projection points
(every step of the window, or a sparse ladder: :func:`br_serve.core.fscore.horizon_points`)
and the envelope ``M(h)``; :class:`GrowingScore` scores one replica for ``n`` admitted
requests counting their own growth. The model implements
:class:`br_serve.core.tick.MarginModel`.
"""

from __future__ import annotations

from operator import mul
from typing import TypeAlias

import numpy as np

from br_serve.core.fscore import HorizonScore
from br_serve.core.types import FloatArray

#: a vector over the window's points: a Python list (the tick's form) or an array
Vector: TypeAlias = "list[float] | FloatArray"


class GrowingScore:
    """BR-H score of one replica counting the admitted requests' own growth.

    Admitting ``n`` requests of total prompt ``D`` adds ``D + n*h`` to the replica's
    load at step ``h``, so ``F_n(D) = alpha*sum_h d_h (D + n h)
    - beta*sum_h d_h (D + n h - m(h))_+``: the paper's score with margins ``m - n*h`` and
    a constant ``alpha*n*sum_h d_h h``. With ``alpha = 1, beta = G`` it is exactly
    ``-sum_h d_h dI(h)``. Leaving the growth out made BR-H overfill replicas with a free
    slot (their margins grow with ``h`` only until the new request starts growing too):
    measured, imbalance rose with ``H`` even with the gate closed (docs/core.md).
    ``peak`` is the single-request peak (``n = 1``). The vectors are plain Python lists
    (arrays are converted): a window of a few points costs less without numpy's
    per-call overhead, and the tick builds one of these per decision.
    """

    __slots__ = ("_args", "_bonus1", "_margins", "_one", "_parts", "peak")

    def __init__(self, margins: Vector, h: Vector, d: Vector, alpha: float,
                 beta: float, uniform: bool, dh: float) -> None:
        # ``dh``: the weights' ``sum_h d_h h``
        self._margins = _as_list(margins)
        self._args = (_as_list(h), _as_list(d), alpha, beta, uniform, dh)
        self._parts: dict[int, tuple[HorizonScore, float]] = {}
        self._one, self._bonus1 = self._part(1)  # the common case, kept at hand
        self.peak = self._one.peak

    def _part(self, n: int) -> tuple[HorizonScore, float]:
        part = self._parts.get(n)
        if part is None:
            h, d, alpha, beta, uniform, dh = self._args
            shifted = [m - n * x for m, x in zip(self._margins, h, strict=True)]
            part = (HorizonScore(shifted, d, alpha, beta, uniform), alpha * n * dh)
            self._parts[n] = part
        return part

    def __call__(self, d_tokens: float, n_requests: int = 1) -> float:
        if n_requests == 1:
            return self._one(d_tokens) + self._bonus1
        sc, bonus = self._part(n_requests)
        return sc(d_tokens) + bonus


class HorizonMargins:
    """Projected loads ``L_g(h)``, envelope ``M(h)`` and margin vectors ``M - L_g`` at
    the projection points ``h``, each weighing ``d_h``.

    The tick works on Python lists (``loads`` arrive as a ``(G, points)`` array and are
    copied once): per decision it touches one replica's few points, where numpy's
    per-call overhead would be most of the cost. Scorers are cached per replica and
    dropped when an admission changes what they depend on (the replica's own loads, or
    the envelope).
    """

    __slots__ = ("_cache", "alpha", "beta", "d", "dh", "h", "ld", "loads", "top", "uniform")

    def __init__(self, loads: FloatArray, alive: np.ndarray, d: FloatArray, alpha: float,
                 beta: float, h: FloatArray) -> None:
        width = loads.shape[1]
        self.loads: list[list[float]] = loads.tolist()
        self.d: list[float] = d.tolist()
        self.alpha = alpha
        self.beta = beta
        self.h: list[float] = h.tolist()
        self.dh = sum(map(mul, self.d, self.h))
        self.uniform = self.d.count(1.0) == width
        n_alive = int(np.count_nonzero(alive))
        # every replica alive (the usual case): no boolean-mask copy of the loads
        top = (loads.max(axis=0) if n_alive == alive.shape[0] else loads[alive].max(axis=0)
               if n_alive else None)
        self.top: list[float] = [0.0] * width if top is None else top.tolist()
        self.ld: list[float] = (loads @ d).tolist()
        self._cache: dict[int, GrowingScore] = {}

    def rank(self, g: int) -> float:
        return -self.ld[g]  # discounted margin (M - L_g)'d, less the common M'd

    def margins(self, g: int, rows: list[list[float]] | None = None) -> list[float]:
        """``top - L_g`` (or ``top`` less ``g``'s row of ``rows``)."""
        row = (self.loads if rows is None else rows)[g]
        return [t - x for t, x in zip(self.top, row, strict=True)]

    def scorer(self, g: int) -> GrowingScore:
        sc = self._cache.get(g)
        if sc is None:
            sc = GrowingScore(self.margins(g), self.h, self.d, self.alpha, self.beta,
                              self.uniform, self.dh)
            self._cache[g] = sc
        return sc

    def _raise_top(self, g: int, row: list[float]) -> None:
        """Record ``g``'s new row: its discounted load, and the envelope if it rose."""
        self.ld[g] = sum(row) if self.uniform else sum(map(mul, row, self.d))
        top = self.top
        if any(x > t for x, t in zip(row, top, strict=True)):
            self.top = list(map(max, top, row))
            self._cache.clear()
        else:
            self._cache.pop(g, None)

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None:
        # new requests grow like the others
        row = [x + d_tokens + n_requests * t for x, t in zip(self.loads[g], self.h,
                                                               strict=True)]
        self.loads[g] = row
        self._raise_top(g, row)


def _as_list(v: Vector) -> list[float]:
    return v if isinstance(v, list) else np.asarray(v, dtype=np.float64).tolist()
