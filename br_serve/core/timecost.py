"""BR-0 in seconds: margins and scores on each replica's modelled step time.

The barrier waits on time, not tokens. Replica ``g``'s step costs
``t_g = a_g L_g + c_g N_g + b_g`` seconds (coefficients from the snapshot: configured,
or fitted online by the driver, :mod:`br_serve.core.calibration`); the step lasts
``T = max_g t_g``. The time imbalance is ``G T - sum_g t_g`` (replica-seconds idle at
the barrier), and admitting ``n`` requests with ``D`` prompt tokens to ``g`` adds
``x = a_g D + c_g n`` to ``t_g``, so the score is BR-0's with seconds for tokens:

    F_g = x - G (x - m_g)_+,   m_g = T - t_g

Its peak in prompt tokens (the bisection target) is ``(m_g - c_g) / a_g``. With equal
coefficients and ``c = 0`` this is BR-0's objective times ``a``, which ranks every
choice alike; :func:`time_margins` then uses BR-0's token model itself, so decisions
are exactly BR-0's (no rounding of ``a (M - L)`` against ``M - L`` at a tie).
"""

from __future__ import annotations

import math

from br_serve.core.types import ClusterSnapshot


class TimeScorer:
    """``F(D, n) = x - G (x - m)_+`` with ``x = a D + c n`` seconds."""

    __slots__ = ("a", "c", "g", "margin_s", "peak")

    def __init__(self, margin_s: float, a: float, c: float, replicas: int) -> None:
        self.margin_s = margin_s
        self.a = a
        self.c = c
        self.g = replicas
        if a > 0:
            self.peak = (margin_s - c) / a
        else:  # load costs nothing here: any prompt fits iff the request itself does
            self.peak = math.inf if c <= margin_s else -1.0

    def __call__(self, d_tokens: float, n_requests: int = 1) -> float:
        x = self.a * d_tokens + self.c * n_requests
        over = x - self.margin_s
        return x - self.g * over if over > 0 else x


class TimeMargins:
    """Per-replica step times now, their envelope ``T`` and margins ``T - t_g``."""

    __slots__ = ("a", "c", "g", "t", "top")

    def __init__(self, cluster: ClusterSnapshot) -> None:
        a = cluster.step_a_s_per_token
        c = cluster.step_c_s_per_request
        t = (a * cluster.load_tokens + c * cluster.running_requests + cluster.step_b_s)
        self.a: list[float] = a.tolist()
        self.c: list[float] = c.tolist()
        self.t: list[float] = t.tolist()
        alive: list[bool] = cluster.alive.tolist()
        self.g = max(1, sum(alive))
        self.top = max((x for x, al in zip(self.t, alive, strict=True) if al), default=0.0)

    def rank(self, g: int) -> float:
        return -self.t[g]  # margin T - t_g, less the common T

    def scorer(self, g: int) -> TimeScorer:
        return TimeScorer(self.top - self.t[g], self.a[g], self.c[g], self.g)

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None:
        self.t[g] += self.a[g] * d_tokens + self.c[g] * n_requests
        if self.t[g] > self.top:
            self.top = self.t[g]


def homogeneous_tokens(cluster: ClusterSnapshot) -> bool:
    """Equal ``a`` and ``b`` on every alive replica and ``c = 0``: time is tokens x ``a``."""
    al = cluster.alive
    if not al.any():
        return True
    a, b = cluster.step_a_s_per_token[al], cluster.step_b_s[al]
    return bool((a == a[0]).all() and (b == b[0]).all()
                and (cluster.step_c_s_per_request[al] == 0).all() and a[0] > 0)
