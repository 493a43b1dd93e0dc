"""Paired replay ensembles: every spec on the same K perturbed replays of a trace.

``run_ensemble(trace, specs, replays=K, replay_mode=...)`` simulates each
:class:`RunSpec` on each replay (:mod:`br_serve.sim.replays`) and pairs every spec with
the ``baseline`` spec of the same cluster (same replicas, slots and cluster model) *per
replay*. For a spec A and its baseline B, replay r gives the gain
``d_r = thr_A,r / thr_B,r - 1``; the ensemble row reports the mean of ``d_r``, its
standard error and the two-sided 95% Student t-interval over the K paired values
(:func:`br_serve.sim.stats.paired`). A difference whose interval holds 0 is a tie.

``headroom_share_mean`` is the share of the baseline's headroom a spec captured, as a
ratio of means over the replays: ``sum_r (thr_A,r - thr_B,r) / sum_r (bound_A,r -
thr_B,r)`` with ``bound`` the spec's own balanced bound (a ratio of means is stable
where a single replay's headroom is near 0).

Every other metric ``M`` of the per-run summaries gets ``M_mean`` and ``M_se`` (the s.e.
of the mean over replays; ``None`` with K = 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from br_serve.sim.config import ENGINE_FIELDS, SimConfig
from br_serve.sim.replays import Replay, make_replays
from br_serve.sim.runner import Runner, RunSpec, Task
from br_serve.sim.stationary import Stationary
from br_serve.sim.stats import Paired, paired
from br_serve.traces import Trace

#: Per-run metrics summarised as ``<name>_mean`` / ``<name>_se`` in ensemble rows.
METRICS = (
    "throughput_tok_s", "balanced_bound_tok_s", "mean_imbalance_tokens",
    "barrier_idle_share", "mean_step_ms", "tokens_per_busy_s",
    "tpot_p50_ms", "tpot_p95_ms", "ttft_p50_ms", "ttft_p95_ms",
    "wait_beyond_fcfs_s_p50", "wait_beyond_fcfs_s_p99", "wait_beyond_fcfs_s_max",
    "wait_beyond_fcfs_ranks_p99", "pool_age_s_p50", "pool_age_s_p99", "pool_age_s_max",
    "pool_age_mean_s_first", "pool_age_mean_s_last",
    "admitted_vs_offered_prompt", "admitted_vs_offered_output",
    "drain_throughput_tok_s", "whole_run_throughput_tok_s", "makespan_s",
    "tick_p50_us", "tick_p99_us", "dyntralb_waiting_share",
    "fcfs_replay_delay_s_p99", "fcfs_replay_delay_s_max",
    "fcfs_rule_excess_s_p99", "fcfs_rule_excess_s_max",
    "pace_rule_excess_s_p99", "pace_rule_excess_s_max",
)

#: the fairness rule reported against the baseline's replay of the same window
#: (docs/core.md, "Fairness"): TTFT <= FCFS_RULE_FACTOR x the baseline's TTFT + slack
FCFS_RULE_FACTOR = 2.0

#: SimConfig fields that describe the contender rather than the cluster: the router's
#: policy and the decode ranks' own scheduling (DyntraLB). Runs that differ only in
#: these are paired.
POLICY_FIELDS = frozenset({"policy", "predictor", "seed"}) | ENGINE_FIELDS


def cluster_key(cfg: SimConfig) -> str:
    """What must be equal for two runs to be paired (everything but the policy side)."""
    return json.dumps({k: v for k, v in cfg.model_dump(mode="json").items()
                       if k not in POLICY_FIELDS}, sort_keys=True)


@dataclass(frozen=True, slots=True)
class EnsembleResult:
    """``runs``: one summary per (spec, replay), with ``replay``, ``gain_vs_baseline``
    and ``headroom_share`` filled in; ``ensemble``: one row per spec (see the module
    docstring); ``replays``: where each replay came from."""

    runs: list[dict[str, Any]]
    ensemble: list[dict[str, Any]]
    replays: list[dict[str, Any]]
    baseline: str
    replay_mode: str
    mode: str
    meta: dict[str, Any] = field(default_factory=dict)

    def row(self, label: str, replicas: int | None = None) -> dict[str, Any]:
        """The ensemble row of ``label`` (at ``replicas``, if several)."""
        for r in self.ensemble:
            if r["label"] == label and (replicas is None or r["replicas"] == replicas):
                return r
        raise KeyError(f"no ensemble row {label!r} (replicas {replicas})")

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "ensemble": self.ensemble, "replays": self.replays,
                "baseline": self.baseline, "replay_mode": self.replay_mode,
                "mode": self.mode, **self.meta}


def run_ensemble(trace: Trace, specs: Sequence[RunSpec], *, replays: int = 8,
                 replay_mode: str = "window", limit: int | None = None,
                 jitter_ms: float = 0.0, seed: int = 0, baseline: str = "jsq",
                 stationary: Stationary | None = None, warm_start: Trace | None = None,
                 jobs: int | None = None, rate_scale: float = 1.0,
                 progress: Callable[[int, int], None] | None = None) -> EnsembleResult:
    """Simulate every spec on the same ``replays`` perturbed replays and pair them.

    ``stationary``: run the stationary saturated protocol instead of each spec's own
    mode. ``warm_start``: history fed to every predictor before its run.
    ``rate_scale``: divide every replay's arrival times by it (trace-timed load).
    ``jobs``: worker processes (default: the machine's cores); the result does not
    depend on it.

    Raises:
        ValueError: a bad replay argument, a baseline that is not among the specs, a
            duplicate label, or a trace too short (each message names the field).
    """
    reps = make_replays(trace, replay_mode, replays, limit=limit, seed=seed,
                        jitter_ms=jitter_ms)
    if not rate_scale > 0:
        raise ValueError(f"rate_scale: must be > 0 (got {rate_scale})")
    check_baseline(specs, baseline)
    with Runner(specs, reps, stationary=stationary, warm_start=warm_start,
                jobs=jobs) as runner:
        tasks = [Task(s, r.index, rate_scale) for r in reps for s in range(len(specs))]
        rows = runner.run(tasks, progress)
    return assemble(specs, reps, rows, baseline, replay_mode, stationary)


def paired_gain(runs: Sequence[dict[str, Any]], label: str, against: str,
                replicas: int | None = None, metric: str = "throughput_tok_s") -> Paired:
    """Paired statistics of ``metric(label) / metric(against) - 1`` over the replays of
    ``runs`` (an ensemble's ``runs`` list), e.g. ``brh+survival`` against ``br0``.

    Raises:
        KeyError: a label without runs, or replays present for one label only.
    """
    def per(lab: str) -> dict[int, float]:
        out = {r["replay"]: r[metric] for r in runs
               if r["label"] == lab and (replicas is None or r["replicas"] == replicas)}
        if not out:
            raise KeyError(f"no runs labelled {lab!r} (replicas {replicas})")
        return out

    a, b = per(label), per(against)
    if set(a) != set(b):
        raise KeyError(f"{label!r} and {against!r} were not run on the same replays")
    return paired([a[r] / b[r] - 1.0 for r in sorted(a)])


def engine_options(cfg: SimConfig) -> dict[str, Any]:
    """The decode ranks' scheduling options set away from their defaults, by their flat
    names (``dyntralb_mode``, as ``--engine-option`` takes them)."""
    dumped = cfg.model_dump(include=set(ENGINE_FIELDS), exclude_defaults=True)
    return {f"{section}_{k}": v for section, fields in dumped.items()
            for k, v in fields.items()}


def check_baseline(specs: Sequence[RunSpec], baseline: str) -> None:
    names = [s.name for s in specs]
    if baseline not in names:
        raise ValueError(f"baseline: {baseline!r} is not among the runs "
                         f"({', '.join(dict.fromkeys(names))})")


def assemble(specs: Sequence[RunSpec], reps: Sequence[Replay], rows: list[dict[str, Any]],
             baseline: str, replay_mode: str,
             stationary: Stationary | None) -> EnsembleResult:
    """Pair ``rows`` (one per (replay, spec), in task order) into an EnsembleResult."""
    k, p = len(reps), len(specs)
    grid = [[rows[r * p + s] for r in range(k)] for s in range(p)]  # grid[spec][replay]
    base_of: dict[int, int | None] = {}
    for s, spec in enumerate(specs):
        key = cluster_key(spec.config)
        base_of[s] = next((b for b, bs in enumerate(specs) if bs.name == baseline
                           and cluster_key(bs.config) == key), None)
    ensemble = []
    for s, spec in enumerate(specs):
        b = base_of[s]
        for r in range(k):
            grid[s][r].update(_pair(grid[s][r], None if b is None else grid[b][r],
                                    baseline))
            grid[s][r].update(fcfs_replay_fairness(grid[s][r], None if b is None
                                                   else grid[b][r]))
        ensemble.append(_row(spec, grid[s], None if b is None else grid[b], baseline))
    for col in grid:
        for run in col:
            run.pop("_ttft_s", None)
    runs = [grid[s][r] for r in range(k) for s in range(p)]
    mode = ("stationary" if stationary is not None
            else "saturated" if specs[0].config.sim.saturated else "trace")
    info = [{"index": r.index, "start": r.start, "seed": r.seed, "requests": len(r.trace),
             "mode": r.mode} for r in reps]
    meta: dict[str, Any] = {"window_overlap": window_overlap(reps)}
    if stationary is not None:
        meta["stationary"] = {"pool_depth": stationary.pool_depth,
                              "warmup_admissions": stationary.warmup_admissions,
                              "representative_tol": stationary.representative_tol}
    return EnsembleResult(runs, ensemble, info, baseline, replay_mode, mode, meta)


def window_overlap(reps: Sequence[Replay]) -> float | None:
    """Mean share of a window's requests that another window also holds (over all
    pairs); 0 for disjoint windows, None unless the mode is ``window``. Overlapping
    windows make replays correlated, so their intervals are optimistic."""
    if len(reps) < 2 or any(r.mode != "window" for r in reps):
        return None
    shares = []
    for i, a in enumerate(reps):
        for b in reps[i + 1:]:
            na, nb = len(a.trace), len(b.trace)
            inter = max(0, min(a.start + na, b.start + nb) - max(a.start, b.start))
            shares.append(inter / min(na, nb))
    return sum(shares) / len(shares)


def _pair(run: dict[str, Any], base: dict[str, Any] | None,
          baseline: str) -> dict[str, Any]:
    thr = run.get("throughput_tok_s")
    b = None if base is None else base.get("throughput_tok_s")
    bound = run.get("balanced_bound_tok_s")
    gain = thr / b - 1.0 if thr is not None and b else None
    share = ((thr - b) / (bound - b) if thr is not None and b and bound is not None
             and bound > b else None)
    return {"baseline": baseline if base is not None else None,
            "gain_vs_baseline": gain, "headroom_share": share}


def fcfs_replay_fairness(run: dict[str, Any], base: dict[str, Any] | None
                         ) -> dict[str, float | None]:
    """Each request's TTFT against its TTFT in the baseline's replay of the same
    window (the baseline, ``jsq``, serves the pool in FCFS order): P99 and max of the
    delay beyond it (``ttft - ttft_fcfs``) and of the excess over the stated rule
    (``ttft - FCFS_RULE_FACTOR x ttft_fcfs``; the rule holds where it is <= its slack).
    None without a baseline or per-request times."""
    keys = ("fcfs_replay_delay_s_p99", "fcfs_replay_delay_s_max",
            "fcfs_rule_excess_s_p99", "fcfs_rule_excess_s_max")
    mine = run.get("_ttft_s")
    theirs = None if base is None else base.get("_ttft_s")
    if mine is None or theirs is None or len(mine) != len(theirs):
        return dict.fromkeys(keys, None)
    a, b = np.asarray(mine, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if not ok.any():
        return dict.fromkeys(keys, None)
    delay = a[ok] - b[ok]
    excess = a[ok] - FCFS_RULE_FACTOR * b[ok]
    return dict(zip(keys, (float(np.percentile(delay, 99)), float(delay.max()),
                           float(np.percentile(excess, 99)), float(excess.max())),
                    strict=True))


def _mean_se(vals: list[Any]) -> tuple[float | None, float | None]:
    xs = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
    if len(xs) < len(vals) or not xs:
        return None, None  # a metric missing in some replay has no paired mean
    st = paired(xs)
    return st.mean, st.se


def _row(spec: RunSpec, mine: list[dict[str, Any]], base: list[dict[str, Any]] | None,
         baseline: str) -> dict[str, Any]:
    first = mine[0]
    row: dict[str, Any] = {
        "label": spec.name, "policy": spec.config.policy.name, "predictor": first["predictor"],
        "replicas": spec.config.replicas, "slots": spec.config.slots,
        "mode": first["mode"], "replays": len(mine),
        "baseline": baseline if base is not None else None,
        "policy_options": dict(spec.config.policy.options),
        "engine_options": engine_options(spec.config),
    }
    for m in METRICS:
        row[f"{m}_mean"], row[f"{m}_se"] = _mean_se([r.get(m) for r in mine])
    rep = [r.get("representative", "absent") for r in mine]
    stationary = all(x != "absent" for x in rep)
    # shares of replays whose admissions were representative / clearly not (None: the
    # window was too short to tell); both None outside the stationary mode
    row["representative_share"] = (sum(x is True for x in rep) / len(rep)
                                   if stationary else None)
    row["unrepresentative_share"] = (sum(x is False for x in rep) / len(rep)
                                     if stationary else None)
    gains = [r["gain_vs_baseline"] for r in mine]
    if base is None or any(g is None for g in gains):
        row.update(gain_vs_baseline_mean=None, gain_vs_baseline_se=None,
                   gain_vs_baseline_ci95=None, gain_vs_baseline_tie=None,
                   headroom_share_mean=None)
        return row
    st = paired(gains)
    row.update(gain_vs_baseline_mean=st.mean, gain_vs_baseline_se=st.se,
               gain_vs_baseline_ci95=None if st.ci95 is None else list(st.ci95),
               gain_vs_baseline_tie=st.tie)
    used = sum(r["throughput_tok_s"] - b["throughput_tok_s"]
               for r, b in zip(mine, base, strict=True))
    room = sum(r["balanced_bound_tok_s"] - b["throughput_tok_s"]
               for r, b in zip(mine, base, strict=True)
               if r["balanced_bound_tok_s"] is not None)
    row["headroom_share_mean"] = used / room if room > 0 else None
    return row
