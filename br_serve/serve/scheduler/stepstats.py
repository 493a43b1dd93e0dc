"""Counters the scheduler keeps for ``/v1/br/state`` and benchmarks (plain, no Ray).

Step counters cover *busy* steps (some replica running), as the simulator counts them,
measured at the barrier by the group's rank 0.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

RECENT_STEPS = 200


class StepStats:
    """Barrier-measured step counters plus tick timings; :meth:`reset` starts over."""

    def __init__(self) -> None:
        self.recent_imbalance: collections.deque[int] = collections.deque(maxlen=RECENT_STEPS)
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.imbalance_sum = 0
        self.step_s_sum = 0.0
        self.model_step_s_sum = 0.0
        self.tokens = 0
        self.replica_steps = 0  # members summed over busy steps
        self.load_sum = 0
        self.tick_s: list[float] = []
        self.assigned = 0
        self.dispatch_failures = 0
        self.recent_imbalance.clear()

    def record_step(self, loads: np.ndarray, running: int, step_s: float,
                    model_step_s: float) -> int:
        """One barrier step: ``loads`` of the members, tokens produced (``running``),
        measured wall time and the step model's price of the same loads. Returns the
        step's imbalance ``G*max(L) - sum(L)``."""
        total = int(loads.sum())
        imb = int(len(loads) * loads.max() - total) if len(loads) else 0
        self.recent_imbalance.append(imb)
        if running:
            self.steps += 1
            self.replica_steps += len(loads)
            self.load_sum += total
            self.imbalance_sum += imb
            self.step_s_sum += step_s
            self.model_step_s_sum += model_step_s
            self.tokens += running
        return imb

    def record_tick(self, seconds: float, assigned: int) -> None:
        self.tick_s.append(seconds)
        self.assigned += assigned

    def recent_mean_imbalance(self) -> float:
        return float(np.mean(self.recent_imbalance)) if self.recent_imbalance else 0.0

    def as_dict(self) -> dict[str, Any]:
        """``throughput_tok_s = tokens / busy_s`` (wall-clock steps);
        ``model_throughput_tok_s`` prices the same measured loads with the step model
        (free of host CPU contention); a replica's mean load and running requests per
        busy step; tick+dispatch percentiles in ms."""
        ticks = np.asarray(self.tick_s, dtype=np.float64)
        n = self.steps

        def pct(q: float) -> float:
            return float(np.percentile(ticks, q) * 1e3) if len(ticks) else 0.0

        return {
            "steps": n,
            "mean_imbalance_tokens": self.imbalance_sum / n if n else 0.0,
            "mean_step_s": self.step_s_sum / n if n else 0.0,
            "busy_s": self.step_s_sum, "tokens": self.tokens,
            "throughput_tok_s": self.tokens / self.step_s_sum if self.step_s_sum else 0.0,
            "model_busy_s": self.model_step_s_sum,
            "mean_replica_load_tokens": (self.load_sum / self.replica_steps
                                         if self.replica_steps else 0.0),
            "mean_replica_running": (self.tokens / self.replica_steps
                                     if self.replica_steps else 0.0),
            "model_throughput_tok_s": (self.tokens / self.model_step_s_sum
                                       if self.model_step_s_sum else 0.0),
            "ticks": len(ticks), "assigned": self.assigned,
            "tick_dispatch_s_total": float(ticks.sum()),
            "tick_dispatch_ms_p50": pct(50), "tick_dispatch_ms_p99": pct(99),
            "dispatch_failures": self.dispatch_failures,
        }
