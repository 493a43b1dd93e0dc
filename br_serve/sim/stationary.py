"""Stationary saturated mode: a pool kept at a fixed depth, measured after a warm-up.

A saturated cluster never drains. The stationary protocol runs the saturated simulator
with ``pool_capacity = pool_depth``: every request is prefilled, and the pool is topped
up from the trace (in trace order) to ``pool_depth`` whenever a tick frees room, so the
policy always chooses among ``pool_depth`` candidates. Metrics cover the **stationary
window** of steps ``[w0, w1]``:

- ``w0``: the step at which the ``warmup_admissions``-th request was admitted (default
  ``pool_depth`` + 2 x the cluster's slots: under FCFS order everything in the pool and
  the slots at t = 0 has been admitted by then, plus one more turnover of the slots);
- ``w1``: the step at whose start the last request of the trace entered the pool (the
  pool is full through step ``w1``; afterwards it can no longer be topped up).

A policy that defers what it cannot place well cannot turn that into throughput here:
the deferred requests stay in the pool, the pool fills with them, and the run reports
it as age and as unrepresentative admissions:

- ``pool_age_s_*``: ages (time since pool entry) of the requests in the pool at
  ``age_samples`` steps spread evenly over the window, pooled; ``pool_age_mean_s_first``
  / ``_last``: the mean age in the first and last quarter of those samples (growing age
  = deferral piling up).
- representativeness: the mean prompt and output of the ``m`` requests admitted in the
  window against the ``m`` requests FCFS would have admitted there (the next ``m`` in
  pool-entry order after those admitted before the window). For a policy that admits in
  pool order the two sets are the same. The two sets differ in ``d`` requests
  (``representative_set_difference``); were those random draws of the workload, the
  ratio would scatter by ``noise = sqrt(d) * sd / (m * mean)``
  (``admitted_vs_offered_*_noise``). ``representative`` is True when both ratios are
  within ``representative_tol`` (5%) of 1, False when one is beyond it *and* beyond
  twice its noise (deferral), and None when it is beyond the tolerance but within the
  noise: the window is too short to tell (a heavy-tailed prompt distribution needs
  ``m`` well above ``d``; replay more requests).

In this mode TTFT counts from pool entry (there are no arrival times), TPOT covers the
requests whose whole decode lies inside the window, and the wait beyond FCFS
(:mod:`br_serve.sim.metrics`) covers the requests admitted inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from br_serve.sim.config import SimConfig, parse_sim_config
from br_serve.sim.metrics import (
    efficiency,
    pace_rule_excess,
    step_start_s,
    wait_beyond_fcfs,
    wait_summary,
)
from br_serve.sim.result import SimResult


@dataclass(frozen=True, slots=True)
class Stationary:
    """The stationary protocol's parameters (``None`` = the default named per field).

    ``pool_depth``: requests kept in the pool (default 4 x replicas x slots).
    ``warmup_admissions``: admissions before the window opens (default pool depth + 2 x
    replicas x slots). ``age_samples``: steps at which pool ages are sampled.
    ``representative_tol``: allowed relative gap of the admitted means.
    """

    pool_depth: int | None = None
    warmup_admissions: int | None = None
    age_samples: int = 32
    representative_tol: float = 0.05

    def __post_init__(self) -> None:
        if self.pool_depth is not None and self.pool_depth < 1:
            raise ValueError(f"pool_depth: must be >= 1 (got {self.pool_depth})")
        if self.warmup_admissions is not None and self.warmup_admissions < 0:
            raise ValueError(f"warmup_admissions: must be >= 0 (got {self.warmup_admissions})")
        if self.age_samples < 1:
            raise ValueError(f"age_samples: must be >= 1 (got {self.age_samples})")
        if not 0 < self.representative_tol < 1:
            raise ValueError(f"representative_tol: must be in (0, 1) "
                             f"(got {self.representative_tol})")

    def depth(self, cfg: SimConfig) -> int:
        return 4 * cfg.replicas * cfg.slots if self.pool_depth is None else self.pool_depth

    def warmup(self, cfg: SimConfig) -> int:
        return (self.depth(cfg) + 2 * cfg.replicas * cfg.slots
                if self.warmup_admissions is None else self.warmup_admissions)

    def sim_config(self, cfg: SimConfig) -> SimConfig:
        """``cfg`` in saturated mode with the pool capped at the depth."""
        return parse_sim_config(cfg, sim_saturated=True, pool_capacity=self.depth(cfg))

    def check(self, requests: int, cfg: SimConfig) -> None:
        """Raise ``ValueError`` when ``requests`` cannot give a stationary window."""
        d, w = self.depth(cfg), self.warmup(cfg)
        if requests <= d + w:
            raise ValueError(
                f"limit: {requests} requests are too few for the stationary mode at "
                f"G={cfg.replicas}, B={cfg.slots}: the pool depth ({d}) plus the warm-up "
                f"({w} admissions) leave no window; replay at least {d + w + 1} requests "
                f"({d + w + 8 * cfg.replicas * cfg.slots} for a window of 8 turnovers of "
                f"the slots) or lower pool_depth / warmup_admissions")


def stationary_summary(res: SimResult, spec: Stationary) -> dict[str, Any]:
    """``res.summary()`` with the headline metrics replaced by the stationary window's
    (``mode = "stationary"``), plus the window, age and representativeness fields.

    Raises:
        ValueError: ``res`` was not run with ``spec.sim_config`` (no pool-entry record),
            or its trace is too short (see :meth:`Stationary.check`).
    """
    cfg = res.config
    n = res.admit_step.shape[0]
    spec.check(n, cfg)
    if res.enqueue_step is None or res.enqueue_order is None or not cfg.sim.saturated:
        raise ValueError("stationary: the run lacks pool-entry records or is not saturated")
    out = res.summary()
    s = res.steps
    total = len(s)
    adm = np.sort(res.admit_step[res.admit_step >= 0])
    warm = spec.warmup(cfg)
    w0 = int(adm[min(warm, adm.size - 1)])
    w1 = int(res.enqueue_step.max())
    hi = min(w1 + 1, total)
    if hi <= w0:
        raise ValueError(f"stationary: the warm-up ({warm} admissions) ended at step {w0}, "
                         f"after the pool stopped being topped up (step {w1}); replay more "
                         f"requests (limit) or lower warmup_admissions")
    tok = float(s.running[w0:hi].sum())
    busy = float(s.tau_s[w0:hi].sum())
    bal = float(s.balanced_tau_s[w0:hi].sum())
    first, fin = res.request_times()
    finish_step = res.finish_steps()
    in_adm = (res.admit_step >= w0) & (res.admit_step < hi)
    inside = in_adm & (finish_step >= 0) & (finish_step < hi)
    multi = inside & (res.output_tokens >= 2)
    tpot = (fin[multi] - first[multi]) / (res.output_tokens[multi] - 1)
    ttft = first[in_adm] - res.enqueue_s[in_adm]
    ranks, waits = wait_beyond_fcfs(res)
    out.update({
        "mode": "stationary",
        "pool_depth": spec.depth(cfg),
        "warmup_admissions": warm,
        "window_start_step": w0,
        "window_end_step": hi,
        "window_steps": hi - w0,
        "window_admitted": int(in_adm.sum()),
        "mean_imbalance_tokens": float(s.imbalance_tokens[w0:hi].mean()),
        "throughput_tok_s": tok / busy if busy > 0 else None,
        "balanced_bound_tok_s": tok / bal if bal > 0 else None,
        **efficiency(s, w0, hi),
        "tpot_p50_ms": _pct(tpot, 50, 1e3),
        "tpot_p95_ms": _pct(tpot, 95, 1e3),
        "ttft_p50_ms": _pct(ttft, 50, 1e3),
        "ttft_p95_ms": _pct(ttft, 95, 1e3),
        **wait_summary(ranks, waits, in_adm, pace_rule_excess(res)),
        **_representative(res, in_adm, int(((res.admit_step >= 0)
                                            & (res.admit_step < w0)).sum()),
                          spec.representative_tol),
        **_pool_ages(res, w0, hi, spec.age_samples),
    })
    return out


def _pct(x: np.ndarray, q: float, scale: float) -> float | None:
    return float(np.percentile(x, q) * scale) if x.size else None


def _representative(res: SimResult, in_adm: np.ndarray, before: int,
                    tol: float) -> dict[str, Any]:
    """Admitted-in-window means against the ``m`` requests FCFS would have admitted
    there (pool-entry ranks ``[before, before + m)``), with the sampling noise of the
    comparison (see the module docstring)."""
    assert res.enqueue_order is not None
    m = int(in_adm.sum())
    fcfs = np.zeros(in_adm.shape[0], dtype=bool)
    fcfs[(res.enqueue_order >= before) & (res.enqueue_order < before + m)] = True
    differ = int((in_adm ^ fcfs).sum())  # requests in one set but not the other
    prompt, output = _prompts(res), res.output_tokens
    out: dict[str, Any] = {"representative_set_difference": differ}
    verdicts: list[bool | None] = []
    for name, col in (("prompt", prompt), ("output", output)):
        a = float(col[in_adm].mean()) if m else None
        f = float(col[fcfs].mean()) if fcfs.any() else None
        ratio = a / f if a is not None and f else None
        # s.d. of the ratio if the differing requests were random draws of the window
        noise = (float(np.sqrt(differ) * col[in_adm | fcfs].std() / (m * f))
                 if m and f else None)
        out[f"admitted_{name}_mean"] = a
        out[f"offered_{name}_mean"] = f
        out[f"admitted_vs_offered_{name}"] = ratio
        out[f"admitted_vs_offered_{name}_noise"] = noise
        if ratio is None or noise is None:
            verdicts.append(False)
        elif abs(ratio - 1.0) <= tol:
            verdicts.append(True)
        else:
            verdicts.append(False if abs(ratio - 1.0) > 2 * noise else None)
    out["representative"] = (False if False in verdicts
                             else None if None in verdicts else True)
    return out


def _prompts(res: SimResult) -> np.ndarray:
    if res.prompt_tokens is None:
        raise ValueError("stationary: the run did not record prompt lengths")
    return res.prompt_tokens


def _pool_ages(res: SimResult, w0: int, hi: int, samples: int) -> dict[str, Any]:
    assert res.enqueue_step is not None
    ks = np.unique(np.linspace(w0, hi - 1, num=min(samples, hi - w0)).astype(np.int64))
    starts = step_start_s(res)
    per: list[np.ndarray] = []
    for k in ks.tolist():
        here = (res.enqueue_step <= k) & ((res.admit_step > k) | (res.admit_step < 0))
        per.append(starts[k] - res.enqueue_s[here])
    allv = np.concatenate(per) if per else np.zeros(0)
    q = max(1, len(per) // 4)

    def mean_of(chunks: list[np.ndarray]) -> float | None:
        x = np.concatenate(chunks) if chunks else np.zeros(0)
        return float(x.mean()) if x.size else None

    return {
        "pool_age_s_p50": _pct(allv, 50, 1.0), "pool_age_s_p99": _pct(allv, 99, 1.0),
        "pool_age_s_max": float(allv.max()) if allv.size else None,
        "pool_age_mean_s_first": mean_of(per[:q]), "pool_age_mean_s_last": mean_of(per[-q:]),
    }
