"""Per-run metrics beyond throughput: barrier efficiency and the wait beyond FCFS.

Efficiency over a window of steps ``[lo, hi)``:

- ``barrier_idle_share`` = mean imbalance / (G * mean max load) =
  ``1 - sum_k sum_g L_g(k) / (G * sum_k max_g L_g(k))``: the share of the barrier's
  token capacity (every replica computing as much as the slowest) left idle by
  imbalance. 0 = every step perfectly balanced.
- ``mean_step_ms``: busy time / steps.
- ``tokens_per_busy_s``: generated tokens / decode-busy seconds (the simulator's
  ``throughput_tok_s``; in a trace-timed run below saturation this still differs between
  policies although the wall-clock token rate equals the offered load).

Wait beyond FCFS, per request (defined for every mode). FCFS order is pool-entry order
(``SimResult.enqueue_order``: trace order in saturated and stationary mode, prefill
finish order in trace-timed mode). Admission order sorts admitted requests by their
first decode step, ties by FCFS order. With ``p`` a request's FCFS position, ``q`` its
admission rank and ``T_j`` the time of the run's ``j``-th admission (the start of that
request's first decode step):

- in ranks: ``max(0, q - p)`` (how many admissions later than its FCFS turn);
- in seconds: ``max(0, T_q - T_p)`` (how much later it got a slot than the run's
  ``p``-th slot went out; under FCFS order ``q = p`` and both are 0).

The counterfactual slot times are the run's own (an FCFS run would have freed slots at
other times), so this measures reordering, not a different schedule's latency.

The stated fairness rule on the same clock (``pace_rule_excess_s``, docs/core.md,
"Fairness"): with ``e`` the request's pool entry, its pool wait ``T_q - e`` against
``PACE_RULE_FACTOR`` x the pool wait FCFS would have given it at the run's own pace,
``max(0, T_p - e)``: ``excess = (T_q - e) - factor x max(0, T_p - e)``. The rule
"pool wait <= factor x FCFS pool wait + slack" holds for a request where its excess is
<= the slack. This is the clock BalanceRoute's ageing keeps online
(:mod:`br_serve.core.ageing`); the pairing against a real FCFS replay is
``fcfs_rule_excess_s`` (:mod:`br_serve.sim.ensemble`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

#: the factor of the stated fairness rule (the default ``fcfs_wait_factor``)
PACE_RULE_FACTOR = 2.0


class StepColumns(Protocol):
    """What the efficiency metrics read of a run's per-step series
    (:class:`~br_serve.sim.result.StepSeries`; declared here so that the metrics sit
    below the result that reports them, with no import back)."""

    @property
    def tau_s(self) -> np.ndarray: ...
    @property
    def max_load_tokens(self) -> np.ndarray: ...
    @property
    def imbalance_tokens(self) -> np.ndarray: ...
    @property
    def running(self) -> np.ndarray: ...
    @property
    def sample_loads(self) -> np.ndarray: ...


class RunRecord(Protocol):
    """What the wait metrics read of a finished run
    (:class:`~br_serve.sim.result.SimResult`)."""

    @property
    def steps(self) -> StepColumns: ...
    @property
    def admit_step(self) -> np.ndarray: ...
    @property
    def enqueue_order(self) -> np.ndarray | None: ...
    @property
    def enqueue_s(self) -> np.ndarray: ...
    def step_end_s(self) -> np.ndarray: ...


def efficiency(steps: StepColumns, lo: int, hi: int) -> dict[str, float | None]:
    """``barrier_idle_share``, ``mean_step_ms``, ``tokens_per_busy_s`` over ``[lo, hi)``."""
    if hi <= lo:
        return {"barrier_idle_share": None, "mean_step_ms": None, "tokens_per_busy_s": None}
    mx = float(steps.max_load_tokens[lo:hi].sum())
    imb = float(steps.imbalance_tokens[lo:hi].sum())
    g = _replicas(steps)
    busy = float(steps.tau_s[lo:hi].sum())
    tok = float(steps.running[lo:hi].sum())
    return {
        "barrier_idle_share": imb / (g * mx) if mx > 0 and g else None,
        "mean_step_ms": 1e3 * busy / (hi - lo),
        "tokens_per_busy_s": tok / busy if busy > 0 else None,
    }


def _replicas(steps: StepColumns) -> int:
    loads = steps.sample_loads
    return int(loads.shape[1]) if loads.ndim == 2 and loads.shape[0] else 0


def step_start_s(res: RunRecord) -> np.ndarray:
    """Absolute start time of every step (idle gaps included)."""
    ends = res.step_end_s()
    out: np.ndarray = ends - res.steps.tau_s
    return out


def _admission_clock(res: RunRecord
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(idx, p, q, t_adm)`` of the requests that entered the pool and were admitted:
    their indices, FCFS positions ``p``, admission ranks ``q`` (indexed by request) and
    the run's admission times in admission order (``t_adm[j]``: the ``j``-th admission,
    non-decreasing). None when there is none."""
    n = res.admit_step.shape[0]
    order = res.enqueue_order
    if order is None or n == 0:
        return None
    ok = (res.admit_step >= 0) & (order >= 0)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return None
    # admission order: by first decode step, ties by FCFS position
    adm = idx[np.lexsort((order[idx], res.admit_step[idx]))]
    q = np.empty(n, dtype=np.int64)
    q[adm] = np.arange(adm.size)
    starts = step_start_s(res)
    t_adm = starts[np.minimum(res.admit_step[adm], starts.shape[0] - 1)]
    return idx, order[idx], q, t_adm


def wait_beyond_fcfs(res: RunRecord) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, seconds)`` per request as in the module docstring; -1 / NaN for a
    request that was never admitted (or never entered the pool)."""
    n = res.admit_step.shape[0]
    ranks = np.full(n, -1, dtype=np.int64)
    secs = np.full(n, np.nan)
    clock = _admission_clock(res)
    if clock is None:
        return ranks, secs
    idx, p, q, t_adm = clock
    ranks[idx] = np.maximum(0, q[idx] - p)
    have = p < t_adm.size  # the p-th slot exists (always, unless some never got one)
    sel = idx[have]
    secs[sel] = np.maximum(0.0, t_adm[q[sel]] - t_adm[p[have]])
    return ranks, secs


def pace_rule_excess(res: RunRecord, factor: float = PACE_RULE_FACTOR) -> np.ndarray:
    """Per request, seconds: pool wait - ``factor`` x its FCFS pool wait at the run's own
    pace (module docstring); NaN for a request never admitted or never in the pool."""
    out = np.full(res.admit_step.shape[0], np.nan)
    clock = _admission_clock(res)
    if clock is None:
        return out
    idx, p, q, t_adm = clock
    have = p < t_adm.size
    sel = idx[have]
    e = np.asarray(res.enqueue_s, dtype=np.float64)[sel]
    fcfs_wait = np.maximum(0.0, t_adm[p[have]] - e)
    out[sel] = (t_adm[q[sel]] - e) - factor * fcfs_wait
    return out


def wait_summary(ranks: np.ndarray, secs: np.ndarray, mask: np.ndarray,
                 excess: np.ndarray | None = None) -> dict[str, Any]:
    """P50 / P99 / max of the wait beyond FCFS over the requests in ``mask`` (and P99 /
    max of the stated rule's excess on the same clock, given :func:`pace_rule_excess`)."""
    r = ranks[mask & (ranks >= 0)]
    s = secs[mask & np.isfinite(secs)]

    def pct(x: np.ndarray, q: float) -> float | None:
        return float(np.percentile(x, q)) if x.size else None

    out = {
        "wait_beyond_fcfs_s_p50": pct(s, 50), "wait_beyond_fcfs_s_p99": pct(s, 99),
        "wait_beyond_fcfs_s_max": float(s.max()) if s.size else None,
        "wait_beyond_fcfs_ranks_p50": pct(r, 50), "wait_beyond_fcfs_ranks_p99": pct(r, 99),
        "wait_beyond_fcfs_ranks_max": int(r.max()) if r.size else None,
    }
    if excess is not None:
        x = excess[mask & np.isfinite(excess)]
        out.update(pace_rule_excess_s_p99=pct(x, 99),
                   pace_rule_excess_s_max=float(x.max()) if x.size else None)
    return out
