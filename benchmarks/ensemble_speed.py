"""Ensemble speed: K replays x P policies x N requests at G replicas; prints and writes JSON.

Usage (from the repository root)::

    python benchmarks/ensemble_speed.py [--trace PATH] [--replays 8] [--requests 1500]
        [--replicas 8] [--jobs N] [--stationary] [--out benchmarks/out/ensemble_speed.json]

Defaults are the goal's configuration (issue 11): ServeGen DeepSeek-R1 with outputs >
1000 tokens (read from ../shared/traces, never copied), 8 random windows of 1,500
requests, the policies jsq, sglang_total_tokens, br0 and brh+survival, G = 8, B = 16,
saturated (steady window), ``--jobs`` = the machine's cores; goal: at most 3 minutes on
the 2-core development machine. ``--stationary`` times the stationary protocol instead.
Wall time covers ``run_ensemble`` (forking the workers included), not loading the trace.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from br_serve.sim import parse_sim_config
from br_serve.sim.ensemble import run_ensemble
from br_serve.sim.runner import RunSpec, default_jobs
from br_serve.sim.stationary import Stationary
from br_serve.traces import load_trace


def _traces_dir() -> Path:
    """``shared/traces`` beside the checkout (a worktree may sit one level deeper)."""
    for up in Path(__file__).resolve().parents:
        if (up / "shared" / "traces").is_dir():
            return up / "shared" / "traces"
    return Path("shared/traces")


TRACE = _traces_dir() / "servegen" / "deepseek_r1_5rps_1h.csv"
POLICIES = (("jsq", None), ("sglang_total_tokens", None), ("br0", None), ("brh", "survival"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--min-output", type=int, default=1001)
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=default_jobs())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stationary", action="store_true")
    ap.add_argument("--goal-s", type=float, default=180.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/ensemble_speed.json"))
    args = ap.parse_args()

    trace = load_trace(args.trace, min_output=args.min_output)
    specs = [RunSpec(parse_sim_config(policy=p, predictor=pr, replicas=args.replicas,
                               slots=args.slots, sim_saturated=True, seed=args.seed))
             for p, pr in POLICIES]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    ens = run_ensemble(trace, specs, replays=args.replays, replay_mode="window",
                       limit=args.requests, seed=args.seed, jobs=args.jobs,
                       stationary=Stationary() if args.stationary else None)
    wall = time.perf_counter() - t0
    sims = len(ens.runs)
    sim_wall = sum(r["wall_s"] for r in ens.runs)
    doc = {
        "trace": str(args.trace), "trace_requests": len(trace), "min_output": args.min_output,
        "replays": args.replays, "requests": args.requests, "replicas": args.replicas,
        "slots": args.slots, "policies": [s.name for s in specs], "jobs": args.jobs,
        "mode": ens.mode, "seed": args.seed, "wall_s": wall, "simulations": sims,
        "sum_simulate_wall_s": sim_wall, "goal_s": args.goal_s, "met": wall <= args.goal_s,
        "load_average_1min_before": load, "load_average_1min_after": os.getloadavg()[0],
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "node": platform.node()},
        "gains": {r["label"]: {"mean": r["gain_vs_baseline_mean"],
                               "se": r["gain_vs_baseline_se"],
                               "ci95": r["gain_vs_baseline_ci95"]} for r in ens.ensemble},
    }
    print(f"ensemble speed: {args.replays} replays x {len(specs)} policies x "
          f"{args.requests} requests, G={args.replicas}, B={args.slots}, {ens.mode}, "
          f"jobs={args.jobs} (load average {load:.1f} before)")
    print(f"  wall {wall:.1f} s for {sims} simulations (sum of per-run simulate() "
          f"{sim_wall:.1f} s) | goal <= {args.goal_s:.0f} s: "
          f"{'met' if doc['met'] else 'MISSED'}")
    for r in ens.ensemble:
        g, se = r["gain_vs_baseline_mean"], r["gain_vs_baseline_se"]
        print(f"  {r['label']:<22} thr {r['throughput_tok_s_mean']:>8,.1f} tok/s  gain "
              f"{100 * g:+.1f} ± {100 * (se or 0):.1f}%")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"  wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
