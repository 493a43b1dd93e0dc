"""Research (issue 28): why the simulator's br0 gain over round robin on the peer bench's
saturated windows (+9.8% at G = 8) does not appear live.

The bench sends a window's 64 requests at once, but they reach the graph's pool over
about a second (send -> pool P50 0.66 s, docs/peers.md), so the tick never sees the whole
window: early ticks bind the few requests there are. This replays the same windows in the
simulator (the options of ``research/peers_sim_variants.py``: outputs clipped to 128,
prompts to 16384, engine.slowdown=2) with the arrivals spread evenly over ``spread``
seconds, for the routers' round robin (binds at arrival) and br0 with its default options
and with the bounded hold at any load (``hold_min_busy_share=0``), and with a bind-to-run
delay (``sim.admit_delay_steps``). Output tok/s is tokens over makespan, as the bench's.

    python -m research.trickle_sim G SLOTS TRACE WINDOW K OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

import numpy as np

from br_serve.bench.serve_report import simulate_one
from br_serve.serve.config import parse_graph_config
from br_serve.traces import Trace
from research.peers_common import bench_cell

ARMS: tuple[tuple[str, dict[str, str]], ...] = (
    ("router_round_robin", {}), ("br0", {}), ("br0", {"hold_min_busy_share": "0"}))


def main(g: int, slots: int, trace: str, n: int, k: int, out: str) -> None:
    base, ws = bench_cell(trace, g, slots, n, k)
    rows: list[dict[str, Any]] = []
    for spread, delay in ((0.0, 0), (0.0, 8), (0.5, 0), (1.0, 0), (2.0, 0)):
        per: dict[str, list[float]] = {}
        for name, opts in ARMS:
            cfg = parse_graph_config(base, policy={"name": name, "options": opts})
            label = name + "".join(f" {k}={v}" for k, v in opts.items())
            vals = []
            for w in ws:
                m = len(w.arrival_s)
                arr = list(np.linspace(0.0, spread, m)) if spread else [0.0] * m
                s = simulate_one(Trace.build(arr, list(w.prompt_tokens),
                                             list(w.output_tokens)), cfg,
                                 admit_delay_steps=delay)
                vals.append(sum(w.output_tokens) / s["makespan_s"])
            per[label] = vals
        rr = per["router_round_robin"]
        for label, vals in per.items():
            gains = [v / r - 1 for v, r in zip(vals, rr, strict=True)]
            rows.append({"spread_s": spread, "admit_delay_steps": delay, "arm": label,
                         "output_tok_s": vals, "vs_round_robin": gains,
                         "vs_round_robin_mean": statistics.mean(gains)})
            print(f"spread {spread} s, delay {delay}: {label}: "
                  f"{statistics.mean(vals):.1f} tok/s, vs round robin "
                  f"{100 * statistics.mean(gains):+.1f}% "
                  f"({', '.join(f'{100 * x:+.1f}' for x in gains)})", flush=True)
    with open(out, "w") as f:
        json.dump({"config": {"replicas": g, "slots": slots, "trace": trace, "window": n,
                              "windows": k, "max_output": 128, "max_prompt": 16384,
                              "engine_slowdown": 2}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), a[2], int(a[3]), int(a[4]), a[5])
