"""Time-aware BR-0 against token BR-0 and the field on heterogeneous and drifting
clusters (paired replay ensembles; prints a table and writes JSON).

Usage (from the repository root)::

    python benchmarks/time_aware.py [--replays 8] [--jobs 2] [--only TOKENS]
        [--json results/time-aware/time_aware.json]

Settings, each on G = 8 replicas of B = 16 slots, base step ``a = 5e-7 s/token,
b = 0.03 s``:

- ``homogeneous``: every replica alike (the identity check: time-aware within 1 point
  of token BR-0);
- ``half-slow``: replicas 4..7 take 1.5x as long (``a`` and ``b`` x 1.5);
- ``drift``: replica 0 becomes 2x slower from mid-run (``--step-drift``), the
  configured coefficients stay the old ones (only calibration can notice);
- ``batch``: a batch-size term ``c`` chosen so that ``c * B`` is half of a typical step
  (``c B = a B (mean prompt + mean output / 2) + b``).

Modes: the stationary saturated protocol of ``benchmarks/results.py`` and trace-timed
at 90% of JSQ's stationary throughput in the same setting. Policies: ``jsq``,
``sglang_total_tokens``, ``min_max``, ``br0`` (tokens), ``br0-time`` (``cost=time``,
coefficients fitted online from the simulated steps) and ``br0-time-fixed``
(``cost=time, step_coefficients=configured``), both with the default straggler rule
(``idle_over_balanced=0.25``, ``straggler_prompt_quantile=0.5``), ``br0-time-idle``
(calibrated, a straggler idled instead of capped: the previous default) and
``br0-time-fill`` (calibrated, ``idle_over_balanced=None``: every free slot filled).
Trace-timed rows add each policy's per-stream decode speed against token BR-0
(paired ``TPOT P50(br0) / TPOT P50 - 1``); ``capacity`` is the highest rate meeting
the setting's SLO (:func:`setting_slo`). Gains over jsq and over token BR-0 are
paired per replay with 95% t-intervals; headroom share is against each setting's own
balanced bound (every step priced at the mean replica's time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from br_serve.bench.workloads import (
    SLO_TPOT_FACTOR,
    SLO_TTFT_S,
    STEP_A,
    STEP_B,
    load_workload,
    stationary_plan,
)
from br_serve.sim import parse_sim_config
from br_serve.sim.capacity import SLO, Bracket, capacity
from br_serve.sim.ensemble import paired_gain, run_ensemble
from br_serve.sim.runner import RunSpec
from br_serve.sim.stationary import Stationary
from br_serve.traces import Trace

G, B = 8, 16
WORKLOADS = ("servegen-r1", "mooncake-conv")
SETTINGS = ("homogeneous", "half-slow", "drift", "batch")
MODES = ("stationary", "trace-90", "capacity")
CAPACITY_REQUESTS = 1000
POLICIES: list[tuple[str, str, dict[str, Any]]] = [
    ("jsq", "jsq", {}), ("sglang_total_tokens", "sglang_total_tokens", {}),
    ("min_max", "min_max", {}), ("br0", "br0", {}),
    ("br0", "br0-time", {"cost": "time"}),
    ("br0", "br0-time-fixed", {"cost": "time", "step_coefficients": "configured"}),
    ("br0", "br0-time-idle", {"cost": "time", "straggler_prompt_quantile": None}),
    ("br0", "br0-time-fill", {"cost": "time", "idle_over_balanced": None})]


def cluster(setting: str, trace: Trace, window_requests: int) -> dict[str, Any]:
    """The SimConfig fields of one setting (cost model, drift)."""
    a = [STEP_A] * G
    b = [STEP_B] * G
    out: dict[str, Any] = {}
    if setting == "half-slow":
        a = [x * (1.5 if g >= G // 2 else 1.0) for g, x in enumerate(a)]
        b = [x * (1.5 if g >= G // 2 else 1.0) for g, x in enumerate(b)]
    elif setting == "drift":
        # mid-run: half the steps a window of this many requests takes on G x B slots
        steps = window_requests * float(trace.output_tokens.mean()) / (G * B)
        out["sim_step_drift"] = ((0, int(steps / 2), 2.0),)
    elif setting == "batch":
        typical = STEP_B + STEP_A * B * (float(trace.input_tokens.mean())
                                         + float(trace.output_tokens.mean()) / 2)
        out["step_c_s_per_request"] = typical / B
    out.update(step_a_s_per_token=tuple(a), step_b_s=tuple(b))
    return out


def trace90_scale(trace: Trace, setting: str, size: int, proto: Stationary,
                  common: dict[str, Any]) -> float:
    """The arrival-rate factor of a trace-90 cell: the trace's offered token rate
    scaled to 90% of jsq's stationary throughput in that setting (``proto``, ``size``:
    the stationary plan; ``common``: the ensemble's replays, mode, seed and jobs)."""
    jsq = run_ensemble(trace, specs(setting, trace, size, True)[:1], limit=size,
                       stationary=proto, **common)
    offered = float(trace.output_tokens.sum() / trace.duration_s)
    return 0.9 * float(jsq.ensemble[0]["throughput_tok_s_mean"]) / offered


def specs(setting: str, trace: Trace, window: int, saturated: bool) -> list[RunSpec]:
    base = cluster(setting, trace, window)
    return [RunSpec(parse_sim_config(policy=p, policy_options=o, replicas=G, slots=B,
                              sim_saturated=saturated, **base), label=label)
            for p, label, o in POLICIES]


def setting_slo(setting: str, trace: Trace) -> SLO:
    """The capacity SLO of a setting: TPOT P95 <= 1.25 x the step time of a full replica
    of mean-size requests at the *configured* mean coefficients (what the operator
    planned with; drift's slowdown is not in it), TTFT P95 <= 10 s."""
    c = cluster(setting, trace, CAPACITY_REQUESTS)
    a = sum(c["step_a_s_per_token"]) / G
    b = sum(c["step_b_s"]) / G + B * c.get("step_c_s_per_request", 0.0)
    full = b + a * B * (float(trace.input_tokens.mean())
                        + float(trace.output_tokens.mean()) / 2)
    return SLO(tpot_p95_ms=round(SLO_TPOT_FACTOR * 1e3 * full, 1), ttft_p95_s=SLO_TTFT_S)


def capacity_cell(trace: Trace, setting: str, proto: Any, size: int,
                  common: dict[str, Any]) -> dict[str, Any]:
    """Capacity at the setting's SLO of every policy (bracket from jsq's saturated rate:
    ``[hi / 8, hi]`` with ``hi`` twice it, in requests per second)."""
    jsq = run_ensemble(trace, specs(setting, trace, size, True)[:1], limit=size,
                       stationary=proto, **common)
    hi = 2.0 * jsq.ensemble[0]["throughput_tok_s_mean"] / float(trace.output_tokens.mean())
    slo = setting_slo(setting, trace)
    cap = capacity(trace, specs(setting, trace, CAPACITY_REQUESTS, False), slo,
                   replays=common["replays"], replay_mode="window",
                   limit=CAPACITY_REQUESTS, seed=common["seed"], jobs=common["jobs"],
                   bracket=Bracket(lo_req_s=hi / 8, hi_req_s=hi, rel_tol=0.03))
    by = {r["label"]: r["capacity_req_s"] for r in cap.runs}
    rows = [{"label": r["label"], "capacity_req_s": r["capacity_req_s"],
             "capacity_vs_jsq": r["capacity_vs_baseline"],
             "capacity_vs_br0": (r["capacity_req_s"] / by["br0"] - 1) if by["br0"] else None,
             "capped": r.get("capped"), "note": r.get("note")} for r in cap.runs]
    return {"slo": {"tpot_p95_ms": slo.tpot_p95_ms, "ttft_p95_s": slo.ttft_p95_s},
            "rows": rows}


def summarise(ens: Any) -> list[dict[str, Any]]:
    rows = []
    for r in ens.ensemble:
        vs_br0 = (paired_gain(ens.runs, r["label"], "br0") if r["label"] != "br0"
                  else None)
        sp = (paired_gain(ens.runs, "br0", r["label"], metric="tpot_p50_ms")
              if r["label"] != "br0" else None)
        rows.append({
            "label": r["label"], "throughput_tok_s_mean": r["throughput_tok_s_mean"],
            "gain_vs_jsq_mean": r["gain_vs_baseline_mean"],
            "gain_vs_jsq_ci95": r["gain_vs_baseline_ci95"],
            "headroom_share_mean": r["headroom_share_mean"],
            "gain_vs_br0_mean": None if vs_br0 is None else vs_br0.mean,
            "gain_vs_br0_ci95": None if vs_br0 is None or vs_br0.ci95 is None
            else list(vs_br0.ci95),
            # per-stream decode speed against token BR-0: TPOT(br0) / TPOT(this) - 1
            "speedup_vs_br0_mean": None if sp is None else sp.mean,
            "speedup_vs_br0_ci95": None if sp is None or sp.ci95 is None
            else list(sp.ci95),
            "tpot_p50_ms_mean": r.get("tpot_p50_ms_mean"),
            "tpot_p95_ms_mean": r.get("tpot_p95_ms_mean"),
            "ttft_p95_ms_mean": r.get("ttft_p95_ms_mean")})
    return rows


def selected(only: list[str], tags: tuple[str, str, str]) -> bool:
    """Within each family (workloads, settings, modes) the named tokens are alternatives;
    a family with none named takes every member."""
    for family, tag in zip((WORKLOADS, SETTINGS, MODES), tags, strict=True):
        named = [t for t in only if t in family]
        if named and tag not in named:
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace-requests", type=int, default=3000)
    ap.add_argument("--only", default="", help="comma list of workload/setting/mode tokens "
                    "(alternatives within a family; e.g. half-slow,drift,capacity)")
    ap.add_argument("--json", type=Path, default=Path("results/time-aware/time_aware.json"))
    args = ap.parse_args()
    only = [t for t in args.only.split(",") if t]
    doc: dict[str, Any] = {"replays": args.replays, "seed": args.seed, "G": G, "B": B,
                           "trace_requests": args.trace_requests, "cells": []}
    common = dict(replays=args.replays, replay_mode="window", seed=args.seed,
                  jobs=args.jobs)
    for wl in WORKLOADS:
        trace = load_workload(wl, args.seed)
        proto, size = stationary_plan(G, B, len(trace))
        for setting in SETTINGS:
            for mode in MODES:
                tags = (wl, setting, mode)
                if not selected(only, tags):
                    continue
                t0 = time.perf_counter()
                if mode == "capacity":
                    cell = capacity_cell(trace, setting, proto, size, common)
                    doc["cells"].append({"workload": wl, "setting": setting, "mode": mode,
                                         "wall_s": time.perf_counter() - t0, **cell})
                    print(f"\n{wl} / {setting} / capacity at TPOT P95 <= "
                          f"{cell['slo']['tpot_p95_ms']} ms, TTFT P95 <= 10 s "
                          f"({time.perf_counter() - t0:.0f} s)")
                    for r in cell["rows"]:
                        vb = r["capacity_vs_br0"]
                        print(f"  {r['label']:<20} {r['capacity_req_s']:.3f} req/s  vs jsq "
                              f"{100 * (r['capacity_vs_jsq'] or 0):+6.1f}%  vs br0 "
                              f"{100 * (vb or 0):+6.1f}%{'  capped' if r['capped'] else ''}",
                              flush=True)
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(doc, indent=1))
                    continue
                if mode == "stationary":
                    ens = run_ensemble(trace, specs(setting, trace, size, True),
                                       limit=size, stationary=proto, **common)
                else:
                    scale = trace90_scale(trace, setting, size, proto, common)
                    ens = run_ensemble(trace, specs(setting, trace, args.trace_requests,
                                                    False),
                                       limit=args.trace_requests, rate_scale=scale, **common)
                rows = summarise(ens)
                doc["cells"].append({"workload": wl, "setting": setting, "mode": mode,
                                     "wall_s": time.perf_counter() - t0, "rows": rows})
                print(f"\n{wl} / {setting} / {mode} ({time.perf_counter() - t0:.0f} s)")
                for r in rows:
                    lo, hi = r["gain_vs_jsq_ci95"] or (0, 0)
                    vb = r["gain_vs_br0_mean"]
                    vb_ci = r["gain_vs_br0_ci95"] or (0, 0)
                    print(f"  {r['label']:<20} thr {r['throughput_tok_s_mean']:9.1f}  "
                          f"vs jsq {100 * (r['gain_vs_jsq_mean'] or 0):+6.1f}% "
                          f"[{100 * lo:+.1f}, {100 * hi:+.1f}]  share "
                          f"{r['headroom_share_mean'] or 0:+.2f}  vs br0 "
                          + ("     -" if vb is None else
                             f"{100 * vb:+6.1f}% [{100 * vb_ci[0]:+.1f}, "
                             f"{100 * vb_ci[1]:+.1f}]"), flush=True)
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
