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
choice alike; :func:`br_serve.core.policies.br0.scalar_model` then uses BR-0's token
model itself, so decisions are exactly BR-0's (no rounding of ``a (M - L)`` against
``M - L`` at a tie).
"""

from __future__ import annotations

import math

import numpy as np

from br_serve.core.types import ClusterSnapshot, FloatArray


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

    def __init__(self, cluster: ClusterSnapshot, load_tokens: FloatArray | None = None,
                 running_requests: FloatArray | None = None) -> None:
        """``load_tokens`` / ``running_requests``: what to price (default: the
        snapshot's, every bound request; br0's ``queued_load`` gives others)."""
        a = cluster.step_a_s_per_token
        c = cluster.step_c_s_per_request
        load = cluster.load_tokens if load_tokens is None else load_tokens
        cnt = cluster.running_requests if running_requests is None else running_requests
        t = (a * load + c * cnt + cluster.step_b_s)
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


def _fixed_s(cluster: ClusterSnapshot) -> FloatArray:
    """Each replica's step cost with no load: ``b_g + c_g N_g`` seconds."""
    out: FloatArray = cluster.step_b_s + cluster.step_c_s_per_request * cluster.running_requests
    return out


def balanced_step_s(cluster: ClusterSnapshot) -> float:
    """The step time ``T*`` at which the alive replicas' current load would be balanced.

    Water-filling: ``T*`` solves ``sum_g max(0, (T* - f_g) / a_g) = sum_g L_g`` with
    ``f_g = b_g + c_g N_g`` (each replica's cost with no load), so a replica whose fixed
    cost alone exceeds ``T*`` would hold no tokens. With equal ``a``, ``b`` and ``c = 0``
    it is the mean replica's step time.
    """
    al = cluster.alive
    a = cluster.step_a_s_per_token[al]
    f = _fixed_s(cluster)[al]
    load = float(cluster.load_tokens[al].sum())
    if len(a) == 0:
        return 0.0
    order = sorted(range(len(a)), key=lambda i: float(f[i]))
    inv, fixed = 0.0, 0.0  # sum 1/a_g and sum f_g/a_g over the replicas filled so far
    t = 0.0
    for k, i in enumerate(order):
        ai = float(a[i])
        if ai <= 0:
            return float(f[i])  # the level reached this replica, which absorbs any load
        inv += 1.0 / ai
        fixed += float(f[i]) / ai
        t = (load + fixed) / inv
        nxt = float(f[order[k + 1]]) if k + 1 < len(order) else float("inf")
        if t <= nxt:
            break
    return t


def stragglers_to_idle(cluster: ClusterSnapshot, over_share: float) -> set[int]:
    """Alive replicas that run requests and whose modelled step time exceeds the bound
    ``(1 + over_share) T*`` while their cost with no load is within it.

    Such a replica sets the barrier beyond what the cluster's load needs, and shedding
    load brings it back under the bound; a new request there adds a slot's growth to
    every later step, so BR-0 with ``idle_over_balanced`` leaves its free slots empty
    until its own requests finish and it falls back. Never idled: an empty replica (so
    the cluster always takes work somewhere and no wait is unbounded), and one whose
    fixed cost alone exceeds the bound (idling could not bring it under; whether using
    it pays is a question of whole slots, its ``b`` against the requests it carries,
    that a margin cannot answer, so BR-0's work-conserving decision stands).
    """
    t_star = balanced_step_s(cluster)
    fixed = _fixed_s(cluster)
    t = cluster.step_a_s_per_token * cluster.load_tokens + fixed
    bound = (1.0 + over_share) * t_star * (1.0 + 1e-9)  # rounding never idles a tie
    out = (cluster.alive & (cluster.running_requests > 0) & (t > bound)
           & (fixed <= bound))
    return set(np.flatnonzero(out).tolist())


def homogeneous_tokens(cluster: ClusterSnapshot) -> bool:
    """Equal ``a`` and ``b`` on every alive replica and ``c = 0``: time is tokens x ``a``."""
    al = cluster.alive
    if not al.any():
        return True
    a, b = cluster.step_a_s_per_token[al], cluster.step_b_s[al]
    return bool((a == a[0]).all() and (b == b[0]).all()
                and (cluster.step_c_s_per_request[al] == 0).all() and a[0] > 0)
