"""Prometheus metrics of the graph (``ray.util.metrics``; scraped from Ray's metrics port).

Created lazily inside the actors that record them (metrics need a connected Ray worker).
"""

from __future__ import annotations

from typing import Any

_MS_BOUNDS: list[float] = [1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000,
                           5000, 10000]
_TOKEN_BOUNDS: list[float] = [1, 1e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6]


class SchedulerMetrics:
    """Per-replica load, imbalance per step, pool size, tick latency."""

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

    def replica(self, g: int, load_tokens: int, running: int) -> None:
        tags = {"replica": str(g)}
        self.load.set(load_tokens, tags=tags)
        self.running.set(running, tags=tags)


class IngressMetrics:
    """Time to first token and time per output token, per request."""

    def __init__(self) -> None:
        from ray.util import metrics

        self.ttft_ms: Any = metrics.Histogram("br_ttft_ms", "time to first token",
                                              boundaries=_MS_BOUNDS)
        self.tpot_ms: Any = metrics.Histogram("br_tpot_ms", "mean time per output token",
                                              boundaries=_MS_BOUNDS)
