"""Capacity per replay window, paired across policies: an interval for capacity gains.

:func:`br_serve.sim.capacity.capacity` finds one rate per policy where the ensemble
means of TPOT P95 and TTFT P95 cross the SLO. That is one number without a spread, and
on K = 4 windows it moved by up to 18% between two brackets of the same windows
(docs/results.md), so no capacity difference under that could be claimed. Here every
(policy, window) pair gets its own bisection (the same :class:`RateSearch`, bracket and
SLO, on that window's TPOT P95 and TTFT P95 alone), and a comparison is the K paired
per-window ratios ``cap_A,r / cap_B,r - 1`` with their mean and 95% t-interval
(:func:`br_serve.sim.stats.paired`), as every other comparison here is. A window whose
baseline capacity is 0 (the SLO not met at the bracket's bottom) has no ratio and is
left out of that comparison (``n`` says how many count).

Rates are ``scale x base_req_s`` with the same base as the pooled search, so a window's
capacity is the rate the pooled search would call it. Each round runs one batch of
(pending policy, window) pairs; cost is that of the pooled search (K runs per policy
per round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from br_serve.sim.capacity import SLO, Bracket, CapacityResult, RateSearch, plan_search
from br_serve.sim.ensemble import cluster_key, engine_options
from br_serve.sim.runner import Runner, RunSpec, Task
from br_serve.sim.stats import paired
from br_serve.traces import Trace


def paired_capacity(trace: Trace, specs: Sequence[RunSpec], slo: SLO, *, replays: int = 8,
                    replay_mode: str = "window", limit: int | None = None,
                    jitter_ms: float = 50.0, seed: int = 0, baseline: str = "jsq",
                    bracket: Bracket | None = None, warm_start: Trace | None = None,
                    jobs: int | None = None,
                    progress: Callable[[str], None] | None = None) -> CapacityResult:
    """Per-window capacity of every spec and paired gains over ``baseline``.

    Each run row has ``capacity_req_s`` (the mean over windows), ``capacity_ci95``,
    ``per_replay`` (one row per window: capacity, whether met / capped, TPOT P95 and
    TTFT P95 at it) and ``capacity_vs_baseline`` / ``capacity_vs_baseline_ci95`` /
    ``capacity_vs_baseline_n`` (paired per-window ratios). Raises as
    :func:`br_serve.sim.capacity.capacity` does.
    """
    br = bracket or Bracket()
    reps, base, lo0, hi0 = plan_search(trace, specs, br, baseline=baseline,
                                       replays=replays, replay_mode=replay_mode,
                                       limit=limit, jitter_ms=jitter_ms, seed=seed)
    state = {(i, k): RateSearch(lo0[i], hi0[i]) for i in hi0 for k in range(len(reps))}
    with Runner(specs, reps, warm_start=warm_start, jobs=jobs) as runner:
        for rnd in range(br.max_rounds):
            todo = [(key, rate) for key, st in state.items()
                    if (rate := st.next_rate(br.rel_tol)) is not None]
            if not todo:
                break
            rows = runner.run([Task(i, reps[k].index, rate / base)
                               for (i, k), rate in todo])
            for ((i, k), rate), row in zip(todo, rows, strict=True):
                state[(i, k)].record(rate, [row], slo)
            if progress is not None:
                progress(f"round {rnd + 1}: {len(todo)} (policy, window) searches "
                         f"advanced")
    runs = [_row(specs[i], [state[(i, k)] for k in range(len(reps))], slo, br)
            for i in range(len(specs))]
    for r, s in zip(runs, specs, strict=True):
        b = next((b for b, bs in enumerate(specs) if bs.name == baseline
                  and cluster_key(bs.config) == cluster_key(s.config)), None)
        r["baseline"] = baseline if b is not None else None
        r.update(compare(r, runs[b]) if b is not None else {})
    meta = {"slo": {"tpot_p95_ms": slo.tpot_p95_ms, "ttft_p95_s": slo.ttft_p95_s},
            "bracket": {"lo_req_s": br.lo_req_s, "hi_req_s": br.hi_req_s,
                        "lo_fraction": br.lo_fraction, "rel_tol": br.rel_tol},
            "base_req_s": base, "replays": len(reps), "replay_mode": replay_mode,
            "baseline": baseline, "search": "per_replay"}
    return CapacityResult(runs, meta)


def compare(run: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Paired per-window capacity ratio of ``run`` over ``base`` (``None`` where no
    window has a baseline capacity above 0)."""
    ratios = [a["capacity_req_s"] / b["capacity_req_s"] - 1.0
              for a, b in zip(run["per_replay"], base["per_replay"], strict=True)
              if b["capacity_req_s"] > 0]
    if not ratios:
        return {"capacity_vs_baseline": None, "capacity_vs_baseline_ci95": None,
                "capacity_vs_baseline_n": 0}
    p = paired(ratios)
    return {"capacity_vs_baseline": p.mean, "capacity_vs_baseline_ci95": p.ci95,
            "capacity_vs_baseline_n": p.n}


def _row(spec: RunSpec, searches: list[RateSearch], slo: SLO,
         br: Bracket) -> dict[str, Any]:
    per = []
    for st in searches:
        r = st.result(spec, slo, br)
        per.append({k: r.get(k) for k in ("capacity_req_s", "met", "capped", "tpot_p95_ms",
                                           "ttft_p95_s", "barrier_idle_share")})
    caps = [float(p["capacity_req_s"] or 0.0) for p in per]
    c = spec.config
    stats = paired(caps)

    def mean(key: str) -> float | None:
        xs = [float(v) for p in per if (v := p[key]) is not None]
        return float(np.mean(xs)) if xs else None

    return {"label": spec.name, "policy": c.policy.name, "predictor": c.predictor.name,
            "replicas": c.replicas, "slots": c.slots,
            "policy_options": dict(c.policy.options), "engine_options": engine_options(c),
            "rel_tol": br.rel_tol,
            "capacity_req_s": stats.mean, "capacity_ci95": stats.ci95,
            "met": all(p["met"] for p in per), "capped": any(p["capped"] for p in per),
            "note": None if all(p["met"] for p in per) else
            f"{sum(not p['met'] for p in per)} window(s) miss the SLO at the bracket's "
            f"bottom (capacity 0 there)",
            "tpot_p95_ms": mean("tpot_p95_ms"), "ttft_p95_s": mean("ttft_p95_s"),
            "barrier_idle_share": mean("barrier_idle_share"), "per_replay": per}
