"""What a simulated run produced, and the summary metrics derived from it.

Windows (docs/simulator.md): in saturated mode the headline metrics cover the steady
window, steps ``[0, steady_steps)`` (until the pool first runs empty); the drain after
it is reported under ``drain_*``. In trace-timed mode the whole run counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from br_serve.sim.config import SimConfig
from br_serve.sim.metrics import efficiency, pace_rule_excess, wait_beyond_fcfs, wait_summary


@dataclass(frozen=True, slots=True)
class StepSeries:
    """Per-step columns (one row per decode step) plus per-replica load samples.

    ``running`` is the number of requests decoding in the step (= tokens it produces).
    ``balanced_tau_s`` is the step time had every alive replica carried the mean load.
    ``sample_*``: per-replica loads at the start of every stretch (loads grow linearly
    inside a stretch, so these points describe the whole curve between events).
    """

    tau_s: np.ndarray
    balanced_tau_s: np.ndarray
    max_load_tokens: np.ndarray
    sum_load_tokens: np.ndarray
    imbalance_tokens: np.ndarray
    running: np.ndarray
    pool: np.ndarray
    sample_t_s: np.ndarray
    sample_step: np.ndarray
    sample_loads: np.ndarray

    def __len__(self) -> int:
        return int(self.tau_s.shape[0])

    @property
    def end_s(self) -> np.ndarray:
        return np.cumsum(self.tau_s)


def _pct(x: np.ndarray, q: float, scale: float) -> float | None:
    return float(np.percentile(x, q) * scale) if x.size else None


@dataclass(frozen=True, slots=True)
class SimResult:
    """A finished run. Step ``k`` produced its tokens at ``step_end_s[k]``; request ``i``
    was admitted before step ``admit_step[i]`` and produced its tokens at the ends of
    steps ``admit_step[i] .. admit_step[i] + output_tokens[i] - 1``."""

    config: SimConfig
    predictor_name: str | None
    source: str
    arrival_s: np.ndarray
    output_tokens: np.ndarray
    admit_step: np.ndarray
    replica: np.ndarray
    enqueue_s: np.ndarray
    steps: StepSeries
    tick_ns: np.ndarray
    steady_steps: int | None
    wall_s: float
    predictor_failed_ticks: int = 0
    #: step at whose start request ``i`` entered the pool, and its rank in pool-entry
    #: order (the order FCFS would admit in); -1 if it never entered
    enqueue_step: np.ndarray | None = None
    enqueue_order: np.ndarray | None = None
    prompt_tokens: np.ndarray | None = None
    #: step of each request's last token where it is not ``admit_step + output - 1``
    #: (DyntraLB pauses requests; -1: not finished); None: that formula holds
    finish_step: np.ndarray | None = None
    #: the decode ranks' own counters (DyntraLB), merged into the summary
    engine_stats: dict[str, Any] | None = None

    # -- per request ---------------------------------------------------------------
    def step_end_s(self) -> np.ndarray:
        """Absolute end time of every step (idle gaps between busy periods included)."""
        return self._abs_end()

    def _abs_end(self) -> np.ndarray:
        # Step times are contiguous inside busy periods; idle gaps (no request running)
        # only happen in trace-timed mode and are recovered from the stretch samples.
        s = self.steps
        ends = np.cumsum(s.tau_s)
        if s.sample_step.size:
            starts_busy = np.concatenate([[0.0], ends])[s.sample_step]
            gap = s.sample_t_s - starts_busy
            shift = np.zeros(len(s))
            shift_at = np.diff(np.concatenate([[0.0], gap]))
            np.add.at(shift, s.sample_step[s.sample_step < len(s)],
                      shift_at[s.sample_step < len(s)])
            ends = ends + np.cumsum(shift)
        return ends

    def finish_steps(self) -> np.ndarray:
        """Step that produced each request's last token (-1: never admitted)."""
        if self.finish_step is not None:
            return np.where(self.admit_step >= 0, self.finish_step, -1)
        return np.where(self.admit_step >= 0, self.admit_step + self.output_tokens - 1, -1)

    def request_times(self) -> tuple[np.ndarray, np.ndarray]:
        """``(first_token_s, finish_s)`` per request (NaN if never admitted or, under
        DyntraLB, never finished)."""
        ends = self._abs_end()
        fs = self.finish_steps()
        ok = (self.admit_step >= 0) & (fs >= 0)
        first = np.full(self.admit_step.shape, np.nan)
        fin = np.full(self.admit_step.shape, np.nan)
        first[ok] = ends[self.admit_step[ok]]
        fin[ok] = ends[fs[ok]]
        return first, fin

    # -- summary -------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The run's metrics (the ``runs`` rows of summary.json). See the module doc."""
        s = self.steps
        cfg = self.config
        total = len(s)
        w = total if self.steady_steps is None else min(self.steady_steps, total)
        first, fin = self.request_times()
        ends = self._abs_end()
        finish_step = self.finish_steps()
        in_win = (finish_step >= 0) & (finish_step < w)
        multi = in_win & (self.output_tokens >= 2)
        tpot = (fin[multi] - first[multi]) / (self.output_tokens[multi] - 1)
        ttft = first[in_win] - self.arrival_s[in_win]

        def window(lo: int, hi: int) -> dict[str, float | None]:
            tok = float(s.running[lo:hi].sum())
            busy = float(s.tau_s[lo:hi].sum())
            bal = float(s.balanced_tau_s[lo:hi].sum())
            return {
                "steps": hi - lo,
                "tokens": tok,
                "busy_s": busy,
                "mean_imbalance_tokens": (float(s.imbalance_tokens[lo:hi].mean())
                                          if hi > lo else None),
                "throughput_tok_s": tok / busy if busy > 0 else None,
                "balanced_bound_tok_s": tok / bal if bal > 0 else None,
            }

        head = window(0, w)
        drain = window(w, total)
        ranks, waits = wait_beyond_fcfs(self)
        admitted_in_win = (self.admit_step >= 0) & (self.admit_step < w)
        ticks = self.tick_ns / 1000.0
        makespan = float(ends[-1]) if total else 0.0
        out: dict[str, Any] = {
            "policy": cfg.policy.name,
            "predictor": self.predictor_name,
            "label": cfg.label,
            "replicas": cfg.replicas,
            "slots": cfg.slots,
            "mode": "saturated" if cfg.sim.saturated else "trace",
            "source": self.source,
            "requests": int(self.output_tokens.shape[0]),
            "mean_imbalance_tokens": head["mean_imbalance_tokens"],
            "throughput_tok_s": head["throughput_tok_s"],
            "balanced_bound_tok_s": head["balanced_bound_tok_s"],
            **efficiency(s, 0, w),
            **wait_summary(ranks, waits, admitted_in_win, pace_rule_excess(self)),
            "tpot_p50_ms": _pct(tpot, 50, 1e3),
            "tpot_p95_ms": _pct(tpot, 95, 1e3),
            "ttft_p50_ms": _pct(ttft, 50, 1e3),
            "ttft_p95_ms": _pct(ttft, 95, 1e3),
            "steps": total,
            "window_steps": w,
            "requests_finished": int((finish_step >= 0).sum()),
            "tokens_generated": int(s.running.sum()),
            "tick_p50_us": _pct(ticks, 50, 1.0),
            "tick_p99_us": _pct(ticks, 99, 1.0),
            "ticks": int(ticks.size),
            "predictor_failed_ticks": self.predictor_failed_ticks,
            "makespan_s": makespan,
            "drain_steps": drain["steps"],
            "drain_s": drain["busy_s"],
            "drain_mean_imbalance_tokens": drain["mean_imbalance_tokens"],
            "drain_throughput_tok_s": drain["throughput_tok_s"],
            "whole_run_throughput_tok_s": window(0, total)["throughput_tok_s"],
            "wall_s": self.wall_s,
            "steps_per_s": total / self.wall_s if self.wall_s > 0 else None,
            "seed": cfg.seed,
            "horizon": cfg.predictor_horizon(),
            "policy_options": dict(cfg.policy.options),
            **(self.engine_stats or {}),
        }
        return out
