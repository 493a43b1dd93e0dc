"""Is trace-timed throughput at 90% load a measure a router can move? (issue 16)

Issue 16 asks time-aware BR-0 for +10% throughput over token BR-0 on heterogeneous
clusters, saturated *and* trace-timed at 90% of jsq's capacity. The simulator's
trace-timed throughput is tokens per busy second (every step's time summed). When a
policy keeps up with the arrivals the cluster is busy from the first arrival to the
last request's end, so its throughput is the offered token rate, give or take the
drain after the last arrival, whatever the routing. This script reruns
``time_aware.py``'s trace-90 cells and prints, per policy, the throughput against the
offered rate of the same replays (the replay's output tokens over its arrival span)
and the busy time against the arrival span, so the ceiling is measured, not argued.

Usage::

    python -m research.offered_rate [--replays 4] [--json results/time-aware/offered_rate.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import time_aware as ta  # the cells' settings, policies and load rule
from br_serve.bench.workloads import load_workload, stationary_plan
from br_serve.sim.ensemble import run_ensemble
from br_serve.sim.replays import make_replays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace-requests", type=int, default=3000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    keep = {"jsq", "br0", "br0-time"}
    common = dict(replays=a.replays, replay_mode="window", seed=a.seed, jobs=a.jobs)
    cells: list[dict[str, Any]] = []
    for wl in ta.WORKLOADS:
        trace = load_workload(wl, a.seed)
        proto, size = stationary_plan(ta.G, ta.B, len(trace))
        for setting in ("half-slow", "drift"):
            scale = ta.trace90_scale(trace, setting, size, proto, common)
            specs = [s for s in ta.specs(setting, trace, a.trace_requests, False)
                     if s.label in keep]
            ens = run_ensemble(trace, specs, limit=a.trace_requests, rate_scale=scale,
                               **common)
            reps = make_replays(trace, "window", a.replays, limit=a.trace_requests,
                                seed=a.seed)
            span = float(np.mean([r.trace.arrival_s.max() - r.trace.arrival_s.min()
                                  for r in reps])) / scale
            offered = float(np.mean([r.trace.output_tokens.sum() for r in reps])) / span
            rows = []
            for r in ens.ensemble:
                thr = r["throughput_tok_s_mean"]
                busy = float(np.mean([x["tokens_generated"] / x["throughput_tok_s"]
                                      for x in ens.runs if x["label"] == r["label"]]))
                rows.append({"label": r["label"], "throughput_tok_s": thr,
                             "throughput_over_offered": thr / offered,
                             "busy_over_arrival_span": busy / span,
                             "makespan_s": r["makespan_s_mean"]})
            cells.append({"workload": wl, "setting": setting, "offered_tok_s": offered,
                          "arrival_span_s": span, "rows": rows})
            print(f"{wl} / {setting} / trace-90: offered {offered:.1f} tok/s over "
                  f"{span:.0f} s of arrivals")
            for x in rows:
                print(f"  {x['label']:<10} thr {x['throughput_tok_s']:8.1f} "
                      f"= {x['throughput_over_offered']:.3f} x offered; busy "
                      f"{x['busy_over_arrival_span']:.3f} x the arrival span")
    if a.json:
        a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)},
                                      "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
