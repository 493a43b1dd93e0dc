"""Prometheus metrics of the graph (``ray.util.metrics``; scraped from Ray's metrics port).

Created lazily inside the actors that record them (metrics need a connected Ray worker).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from br_serve.core.calibration import Coefficients

_MS_BOUNDS: list[float] = [1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000,
                           5000, 10000]
_TOKEN_BOUNDS: list[float] = [1, 1e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6]


class RequestTimeline:
    """Wall-clock (Unix s) marks of requests' hops inside one actor, by request id
    (the scheduler: ``arrival`` at the ingress, ``pool_in``, ``bound`` with its
    ``replica``; a decode replica: ``admit_in``, ``kv_pulled``, ``installed``), plus
    the request's ``seed`` (a client's join key). The first mark of a name wins. The
    ``limit`` most recently first-marked requests are kept: a new one evicts the oldest
    (counted in ``dropped``), so a long-running graph stays bounded and always shows its
    latest requests. Read with the actors' ``timeline()`` RPC. Marks may come from
    several threads (a replica's step thread and its event loop)."""

    def __init__(self, limit: int = 20_000) -> None:
        self.limit = limit
        self.marks: dict[str, dict[str, float]] = {}
        self.dropped = 0
        self._lock = threading.Lock()

    def mark(self, request_id: str, name: str, at_s: float | None = None,
             **extra: float) -> None:
        t = time.time() if at_s is None else at_s
        with self._lock:
            row = self.marks.get(request_id)
            if row is None:
                if len(self.marks) >= self.limit:  # dicts keep insertion order
                    del self.marks[next(iter(self.marks))]
                    self.dropped += 1
                row = self.marks[request_id] = {}
            row.setdefault(name, t)
            for k, v in extra.items():
                row.setdefault(k, v)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"marks": {k: dict(v) for k, v in self.marks.items()},
                    "dropped": self.dropped}


class SchedulerMetrics:
    """Per-replica load, imbalance per step, pool size, tick latency, and (when the
    policy calibrates step costs online) each replica's fitted step coefficients and
    the robust scale of its residuals."""

    def __init__(self) -> None:
        from ray.util import metrics

        self.load = metrics.Gauge("br_replica_load_tokens", "KV load of a decode replica",
                                  tag_keys=("replica",))
        self.running = metrics.Gauge("br_replica_running", "running requests of a replica",
                                     tag_keys=("replica",))
        self.pool = metrics.Gauge("br_pool_size", "prefilled requests waiting in the pool")
        self.imbalance = metrics.Histogram(
            "br_imbalance_tokens", "G*max(L) - sum(L) at the barrier, per step",
            boundaries=_TOKEN_BOUNDS)
        self.tick_ms = metrics.Histogram("br_tick_latency_ms",
                                         "scheduler tick + dispatch time", boundaries=_MS_BOUNDS)
        tags = ("replica",)
        self.coef_a = metrics.Gauge("br_step_coef_a_s_per_token",
                                    "fitted step seconds per KV token of a replica's load",
                                    tag_keys=tags)
        self.coef_b = metrics.Gauge("br_step_coef_b_s", "fitted step seconds per step",
                                    tag_keys=tags)
        self.coef_c = metrics.Gauge("br_step_coef_c_s_per_request",
                                    "fitted step seconds per running request", tag_keys=tags)
        self.coef_residual = metrics.Gauge(
            "br_step_residual_scale_s", "robust scale of the step-time fit's residuals",
            tag_keys=tags)

    def replica(self, g: int, load_tokens: int, running: int) -> None:
        tags = {"replica": str(g)}
        self.load.set(load_tokens, tags=tags)
        self.running.set(running, tags=tags)

    def step_coefficients(self, coef: Coefficients, residual_scale_s: npt.ArrayLike) -> None:
        """Every replica's fit and its residual scale (seconds, one per replica)."""
        resid = [float(x) for x in np.asarray(residual_scale_s).ravel()]
        for g in range(len(coef.a_s_per_token)):
            tags = {"replica": str(g)}
            self.coef_a.set(float(coef.a_s_per_token[g]), tags=tags)
            self.coef_b.set(float(coef.b_s[g]), tags=tags)
            self.coef_c.set(float(coef.c_s_per_request[g]), tags=tags)
            self.coef_residual.set(resid[g], tags=tags)


class IngressMetrics:
    """Time to first token and time per output token, per request."""

    def __init__(self) -> None:
        from ray.util import metrics

        self.ttft_ms: Any = metrics.Histogram("br_ttft_ms", "time to first token",
                                              boundaries=_MS_BOUNDS)
        self.tpot_ms: Any = metrics.Histogram("br_tpot_ms", "mean time per output token",
                                              boundaries=_MS_BOUNDS)
