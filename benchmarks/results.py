"""Regenerate docs/results.md from paired replay ensembles (one command).

Usage (from the repository root)::

    python benchmarks/results.py [--replays 8] [--jobs 2] [--only TOKENS] [--estimate]
        [--json benchmarks/out/results.json] [--md docs/results.md] [--from-json]

Every cell is an ensemble of K (default 8) paired replays (``br_serve.sim.ensemble``):
random windows of the trace (``window`` mode), every policy on the same windows, gains
over ``jsq`` paired per window with a 95% t-interval. Cells per workload:

- ``stationary-G4`` / ``-G8`` / ``-G16``: the stationary saturated protocol (pool kept at
  4 x the cluster's slots; a warm-up of max(pool depth + 2 x slots, 4096) admissions and
  a measured window of max(8 x slots, 4096) admissions, both shrunk to fit 80% of the
  trace where it is shorter: see :func:`stationary_plan`);
- ``trace-80`` / ``trace-95``: trace-timed at G = 8, arrivals scaled so the offered token
  rate is 80% / 95% of JSQ's stationary throughput at G = 8 (windows of
  ``--trace-requests``);
- ``capacity``: capacity at the SLO at G = 8 (``br_serve.sim.capacity``): TPOT P95 <=
  1.25 x the step time of a full, perfectly balanced replica of mean-size requests
  (``b + a * B * (mean prompt + mean output / 2)``), TTFT P95 <= 10 s.

Workloads (read from ../shared/traces, never copied): ServeGen DeepSeek-R1 (outputs >
1000), the same with outputs permuted (seeded), Mooncake conversation, Azure 2023 conv.
Predictors learn online from the requests that finish (no training part).

``--only`` takes a comma list of workload names, cell names or ``workload/cell``; a
trace-timed cell without its workload's ``stationary-G8`` runs a jsq-only stationary
ensemble to set the load. ``--estimate`` times a few probe runs per workload and prints
the planned simulations and an estimated wall time, without running them.
``--from-json`` re-renders the Markdown from an earlier JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.bench.results_render import render
from br_serve.bench.workloads import (
    SLO_TPOT_FACTOR,
    SLO_TTFT_S,
    STATIONARY_G,
    STEP_A,
    STEP_B,
    WORKLOADS,
    load_workload,
    stationary_plan,
)
from br_serve.sim import parse_sim_config
from br_serve.sim.capacity import SLO, Bracket, capacity
from br_serve.sim.ensemble import EnsembleResult, run_ensemble
from br_serve.sim.runner import RunSpec
from br_serve.traces import Trace

#: (policy, predictor, needs prefix hashes). ``vllm_dp`` is left out: without a KV limit
#: (this cluster model) its score is JSQ's (gain exactly 0 with s.e. 0 in every cell of
#: a full run at commit de389a0); ``round_robin`` is left out of the capacity searches.
POLICIES: list[tuple[str, str | None, bool]] = [
    ("jsq", None, False), ("round_robin", None, False), ("sglang_total_tokens", None, False),
    ("min_max", None, False), ("br0", None, False), ("brh", "survival", False),
    ("brh", "exact", True), ("brh", "oracle", False)]
NOT_IN_CAPACITY = frozenset({"round_robin"})
TRACE_LOADS = {"trace-80": 0.80, "trace-95": 0.95}
CELLS = tuple(f"stationary-G{g}" for g in STATIONARY_G) + tuple(TRACE_LOADS) + ("capacity",)
#: settings that must match for --resume to reuse earlier cells
SAME_FOR_RESUME = ("replays", "slots", "seed", "trace_requests", "capacity_requests",
                   "capacity_tol")


def _commit() -> str:
    """HEAD, marked '+dirty' when the core, predictors or simulator have local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "br_serve/core",
                                "br_serve/sim", "predictors"], capture_output=True,
                               text=True).stdout.strip()
    except OSError:
        return "?"
    return head + ("+dirty" if dirty else "")


def specs_for(trace: Trace, g: int, slots: int, saturated: bool,
              for_capacity: bool = False) -> list[RunSpec]:
    """The policy list, minus predictors the trace cannot feed (exact needs hashes)."""
    return [RunSpec(parse_sim_config(policy=p, predictor=pr, replicas=g, slots=slots,
                              sim_saturated=saturated, step_a_s_per_token=STEP_A,
                              step_b_s=STEP_B))
            for p, pr, hashes in POLICIES if (trace.hash_ids is not None or not hashes)
            and not (for_capacity and p in NOT_IN_CAPACITY)]


def slo_for(trace: Trace, slots: int) -> SLO:
    full = STEP_B + STEP_A * slots * (float(trace.input_tokens.mean())
                                      + float(trace.output_tokens.mean()) / 2)
    return SLO(tpot_p95_ms=round(SLO_TPOT_FACTOR * 1e3 * full, 1), ttft_p95_s=SLO_TTFT_S)


def selected(only: list[str] | None, wl: str, cell: str) -> bool:
    if not only:
        return True
    return any(t in (wl, cell, f"{wl}/{cell}") for t in only)


def _progress(tag: str) -> Any:
    t0 = time.perf_counter()

    def cb(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            print(f"  [{tag}] {done}/{total} runs, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    return cb


def _summary_line(tag: str, ens: EnsembleResult) -> None:
    for r in ens.ensemble:
        g, se = r["gain_vs_baseline_mean"], r["gain_vs_baseline_se"]
        print(f"  [{tag}] {r['label']:<22} gain {100 * (g or 0):+6.1f} ± "
              f"{100 * (se or 0):.1f}%  share {r['headroom_share_mean'] or 0:+.2f}", flush=True)


def run_workload(wl: str, args: argparse.Namespace, done: dict[str, Any],
                 save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every selected cell of ``wl`` not already in ``done``; ``save`` after each cell."""
    trace = load_workload(wl, args.seed)
    b = args.slots
    info: dict[str, Any] = {
        "path": str(WORKLOADS[wl]["path"]), "min_output": WORKLOADS[wl]["min_output"],
        "requests": len(trace), "hash_ids": trace.hash_ids is not None,
        "shuffled_outputs": bool(WORKLOADS[wl].get("shuffle_outputs")),
        "input_mean": float(trace.input_tokens.mean()),
        "input_p50": float(np.median(trace.input_tokens)),
        "output_mean": float(trace.output_tokens.mean()),
        "output_p50": float(np.median(trace.output_tokens)),
        "offered_tok_s": float(trace.output_tokens.sum() / trace.duration_s),
        "offered_req_s": float((len(trace) - 1) / trace.duration_s)}
    cells: dict[str, Any] = dict(done)
    common = dict(replays=args.replays, replay_mode="window", seed=args.seed, jobs=args.jobs)

    def keep(name: str, value: dict[str, Any]) -> None:
        cells[name] = value
        save({"info": info, "cells": cells})

    for g in STATIONARY_G:
        name = f"stationary-G{g}"
        if not selected(args.only, wl, name) or name in cells:
            continue
        t0 = time.perf_counter()
        proto, size = stationary_plan(g, b, len(trace))
        ens = run_ensemble(trace, specs_for(trace, g, b, True), limit=size,
                           stationary=proto, progress=_progress(f"{wl} {name}"), **common)
        keep(name, ens.to_dict() | {"wall_s": time.perf_counter() - t0,
                                    "window_requests": size,
                                    "warmup_admissions": proto.warmup_admissions})
        _summary_line(f"{wl} {name}", ens)
    need_trace = [c for c in TRACE_LOADS if selected(args.only, wl, c) and c not in cells]
    if need_trace:
        if "stationary-G8" in cells:
            jsq = next(r for r in cells["stationary-G8"]["ensemble"] if r["label"] == "jsq")
        else:
            proto, size = stationary_plan(8, b, len(trace))
            probe = run_ensemble(trace, specs_for(trace, 8, b, True)[:1], limit=size,
                                 stationary=proto, **common)
            jsq = probe.ensemble[0]
        info["jsq_stationary_G8_tok_s"] = jsq["throughput_tok_s_mean"]
        for c in need_trace:
            scale = TRACE_LOADS[c] * jsq["throughput_tok_s_mean"] / info["offered_tok_s"]
            t0 = time.perf_counter()
            ens = run_ensemble(trace, specs_for(trace, 8, b, False), limit=args.trace_requests,
                               rate_scale=scale, progress=_progress(f"{wl} {c}"), **common)
            keep(c, ens.to_dict() | {"wall_s": time.perf_counter() - t0, "rate_scale": scale,
                                     "load": TRACE_LOADS[c],
                                     "window_requests": args.trace_requests})
            _summary_line(f"{wl} {c}", ens)
    if selected(args.only, wl, "capacity") and "capacity" not in cells:
        slo = slo_for(trace, b)
        bracket = Bracket(rel_tol=args.capacity_tol)
        if "stationary-G8" in cells:  # no policy sustains more than its saturated rate
            top = max(r["throughput_tok_s_mean"] for r in cells["stationary-G8"]["ensemble"])
            hi = 1.2 * top / info["output_mean"]
            bracket = Bracket(lo_req_s=hi / 4, hi_req_s=hi, rel_tol=args.capacity_tol)
        t0 = time.perf_counter()
        cap = capacity(trace, specs_for(trace, 8, b, False, for_capacity=True), slo,
                       replays=args.replays, replay_mode="window",
                       limit=args.capacity_requests, seed=args.seed, jobs=args.jobs,
                       bracket=bracket,
                       progress=lambda m: print(f"  [{wl} capacity] {m}", flush=True))
        keep("capacity", cap.to_dict() | {"wall_s": time.perf_counter() - t0,
                                          "window_requests": args.capacity_requests})
        for r in cap.runs:
            print(f"  [{wl} capacity] {r['label']:<22} {r['capacity_req_s']:.3f} req/s "
                  f"({100 * (r['capacity_vs_baseline'] or 0):+.1f}%) {r['note'] or ''}",
                  flush=True)
    return {"info": info, "cells": cells}


#: per-replay fields kept by :func:`compact` (what the renderer's pairings read)
RUN_KEYS = ("label", "replay", "replicas", "throughput_tok_s", "balanced_bound_tok_s",
            "gain_vs_baseline", "representative")


def compact(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with each ensemble cell's ``runs`` cut to :data:`RUN_KEYS`."""
    out = dict(doc)
    out["workloads"] = {}
    for wl, w in doc["workloads"].items():
        cells = {}
        for name, c in w["cells"].items():
            c = dict(c)
            if "ensemble" in c:
                c["runs"] = [{k: r.get(k) for k in RUN_KEYS} for r in c["runs"]]
            cells[name] = c
        out["workloads"][wl] = {"info": w["info"], "cells": cells}
    return out


def estimate(args: argparse.Namespace) -> None:
    """Probe each workload (jsq and brh+survival: one stationary G = 8 window and one
    trace-timed window at 95% load) and extrapolate the measured seconds per simulated
    request to the planned cells (capacity: 7 rounds of every spec on every replay)."""
    total_s = 0.0
    jobs = max(1, min(args.jobs, os.cpu_count() or 1))
    for wl in WORKLOADS:
        if not any(selected(args.only, wl, c) for c in CELLS):
            continue
        trace = load_workload(wl, args.seed)
        names = ("jsq", "brh+survival")
        st = run_ensemble(trace, [s for s in specs_for(trace, 8, args.slots, True)
                                  if s.name in names], replays=1, replay_mode="window",
                          limit=stationary_plan(8, args.slots, len(trace))[1],
                          stationary=stationary_plan(8, args.slots, len(trace))[0], jobs=1)
        jsq_tok_s = st.row("jsq")["throughput_tok_s_mean"]
        scale = 0.95 * jsq_tok_s / float(trace.output_tokens.sum() / trace.duration_s)
        tt = run_ensemble(trace, [s for s in specs_for(trace, 8, args.slots, False)
                                  if s.name in names], replays=1, replay_mode="window",
                          limit=args.trace_requests, rate_scale=scale, jobs=1)

        def per_spec(ens: EnsembleResult, capacity_only: bool = False,
                     trace: Trace = trace) -> float:
            """Seconds per request summed over the planned specs (brh at the probe's
            brh+survival cost, the others at jsq's)."""
            cost: dict[str, float] = {r["label"]: float(r["wall_s"]) / int(r["requests"])
                                      for r in ens.runs}
            specs = specs_for(trace, 8, args.slots, False, for_capacity=capacity_only)
            return float(sum(cost["brh+survival"] if s.config.predictor.name else cost["jsq"]
                             for s in specs))

        plan = 0.0
        for g in STATIONARY_G:
            if selected(args.only, wl, f"stationary-G{g}"):
                plan += (args.replays * stationary_plan(g, args.slots, len(trace))[1]
                         * per_spec(st))
        plan += sum(args.replays * args.trace_requests * per_spec(tt)
                    for c in TRACE_LOADS if selected(args.only, wl, c))
        if selected(args.only, wl, "capacity"):
            plan += 7 * args.replays * args.capacity_requests * per_spec(tt, True)
        wl_s = plan / jobs
        total_s += wl_s
        n = len(specs_for(trace, 8, args.slots, False))
        print(f"{wl}: probe {1e3 * per_spec(st) / n:.2f} ms (stationary) / "
              f"{1e3 * per_spec(tt) / n:.2f} ms (trace-timed) per request and spec; "
              f"estimated {wl_s / 60:.1f} min with --jobs {args.jobs}")
    print(f"estimated total: {total_s / 60:.1f} min at this machine's current load "
          f"({os.getloadavg()[0]:.1f}); the probes run alone, the cells share the cores")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace-requests", type=int, default=1500)
    ap.add_argument("--capacity-requests", type=int, default=1000)
    ap.add_argument("--capacity-tol", type=float, default=0.03)
    ap.add_argument("--only", type=lambda t: [x.strip() for x in t.split(",") if x.strip()],
                    default=None)
    ap.add_argument("--estimate", action="store_true")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/out/results.json"))
    ap.add_argument("--compact-json", type=Path, default=Path("results/sim/sim_results.json"),
                    help="the ensemble rows and per-replay throughputs only (committed: "
                    "enough to re-render with --from-json)")
    ap.add_argument("--md", type=Path, default=Path("docs/results.md"))
    ap.add_argument("--plots", type=Path, default=Path("docs/results"))
    ap.add_argument("--from-json", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="keep the cells already in --json (same settings) and run the rest")
    args = ap.parse_args()
    for tok in args.only or []:
        wl, _, cell = tok.rpartition("/")
        if tok not in WORKLOADS and tok not in CELLS and not (wl in WORKLOADS
                                                              and cell in CELLS):
            raise SystemExit(f"--only: unknown {tok!r}; workloads {list(WORKLOADS)}, "
                             f"cells {list(CELLS)}")
    if args.replays < 8:
        print(f"note: --replays {args.replays} is below the K >= 8 the results page "
              f"promises; use it for checks only", file=sys.stderr)
    if args.estimate:
        estimate(args)
        return 0
    if args.from_json:
        doc = json.loads(args.json.read_text())
    else:
        t0 = time.perf_counter()
        old = json.loads(args.json.read_text()) if args.resume and args.json.exists() else None
        if old is not None and any(old["config"].get(k) != getattr(args, k)
                                   for k in SAME_FOR_RESUME):
            raise SystemExit(f"--resume: {args.json} was made with other settings "
                             f"({', '.join(SAME_FOR_RESUME)})")
        doc = {"config": {k: (str(v) if isinstance(v, Path) else v)
                          for k, v in vars(args).items()},
               "commit": _commit(), "workloads": {},
               "policies": [f"{p}+{pr}" if pr else p for p, pr, _ in POLICIES],
               "slo": {"tpot_factor": SLO_TPOT_FACTOR, "ttft_p95_s": SLO_TTFT_S},
               "step": {"a_s_per_token": STEP_A, "b_s": STEP_B}, "partial": True}
        if old is not None:
            doc["workloads"] = old["workloads"]
            doc["resumed_from"] = {"commit": old.get("commit"), "wall_s": old.get("wall_s")}
        args.json.parent.mkdir(parents=True, exist_ok=True)

        def save(wl: str) -> Callable[[dict[str, Any]], None]:
            def inner(part: dict[str, Any]) -> None:
                doc["workloads"][wl] = part
                doc["wall_s"] = time.perf_counter() - t0
                args.json.write_text(json.dumps(doc, indent=1, default=str))
            return inner

        for wl in WORKLOADS:
            if any(selected(args.only, wl, c) for c in CELLS):
                print(f"[{wl}]", flush=True)
                done = doc["workloads"].get(wl, {}).get("cells", {})
                doc["workloads"][wl] = run_workload(wl, args, done, save(wl))
        doc["wall_s"] = time.perf_counter() - t0 + (
            (doc.get("resumed_from") or {}).get("wall_s") or 0.0)
        doc["partial"] = False
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        args.compact_json.parent.mkdir(parents=True, exist_ok=True)
        args.compact_json.write_text(json.dumps(compact(doc), indent=0, default=str))
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(render(doc, args.plots, args.md.parent))
    print(f"wrote {args.md} and plots under {args.plots}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
