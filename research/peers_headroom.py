"""How much can any router gain over round robin on bench-peers' saturated windows?

Issue 28 asks the graph for +10% output tok/s over the best real router, saturated, on
bench-peers' windows (K = 4 windows of 64 requests, outputs clipped to 128, prompts to
16384, ``engine.slowdown=2``). This script asks the simulator, on the same windows and
step model, what routing can reach there at all, as a gain over the simulator's model of
the real routers' round robin (``router_round_robin``, bound at arrival):

- ``jsq``, ``br0`` (the defaults), ``br0`` without ageing (``max_wait_beyond_fcfs_s`` and
  ``ttft_budget_s`` off), the model of smg's minimum-tokens rule;
- ``brh`` with the ``exact`` predictor (knows every running request's true remaining
  steps), without ageing and with its look-ahead used at every tick
  (``trust_decode_share`` off): a look-ahead router that knows more than any real one;
- ``br0_queue2``: ``br0`` with the engine queue the live graph runs in front of remote
  engines (``pool.dispatch_ahead`` = 2): the graph as it runs, not what routing can reach;
- ``balanced``: round robin's own run with every step priced at the mean rank load
  (``balanced_bound_tok_s``): the ceiling of balancing alone on that run, not a router.

Beside each arm's throughput gain it reports the arm's simulated TPOT P95 and its paired
change over round robin: whether a gain in tokens per second is paid in the latency tail.

Each window is simulated with ``--seeds`` seeds (a random rule's mean over draws; the
rules here are deterministic, so one is enough). ``--window`` takes several sizes: the
headroom of a saturated window grows with its depth (more requests to choose among per
free slot, a shorter share of the run in the drain), which is what 64 requests on 32
slots lack.

Usage::

    PYTHONPATH=. python -m research.peers_headroom \\
        --trace ../shared/traces/mooncake/conversation_trace.jsonl --replicas 8 --slots 4 \\
        --window 64,256 --json results/peers/headroom_mooncake_g8.json
"""

from __future__ import annotations

import argparse
import json
from itertools import product
from pathlib import Path
from typing import Any

from br_serve.bench.peers_report import SimArm, simulate_windows
from br_serve.sim.stats import paired
from research.peers_common import bench_cell

AGEING_OFF = {"max_wait_beyond_fcfs_s": None, "ttft_budget_s": None}
ARMS: dict[str, SimArm] = {
    "router_round_robin": SimArm("router_round_robin"),
    "smg_min_tokens": SimArm("smg_min_tokens",
                             {"bind": "arrival", "min_tokens_increment": "one"}),
    "jsq": SimArm("jsq"),
    "br0": SimArm("br0"),
    "br0_no_ageing": SimArm("br0", AGEING_OFF),
    "br0_queue2": SimArm("br0", engine_queue=2),
    "brh_exact_no_ageing": SimArm("brh", {**AGEING_OFF, "trust_decode_share": None},
                                  predictor="exact"),
}


def cell(trace: str, g: int, slots: int, n: int, k: int, seeds: int,
         spread_s: float = 0.0) -> dict[str, Any]:
    """Every arm's simulated throughput per window and its paired gain over round robin;
    ``spread_s``: the window's requests arrive evenly over this span instead of at t = 0
    (live, a saturated window reaches the pool over about a second: docs/peers.md)."""
    base, ws = bench_cell(trace, g, slots, n, k)
    sims = simulate_windows(base, ws, ARMS, saturated=True, seeds=seeds, spread_s=spread_s)
    thr: dict[str, list[float]] = {a: s["throughput_tok_s"] for a, s in sims.items()}
    thr["balanced"] = sims["router_round_robin"]["balanced_bound_tok_s"]

    def vs_round_robin(per_arm: dict[str, list[float]]) -> dict[str, Any]:
        rr = per_arm["router_round_robin"]
        return {a: paired([100 * (x / y - 1) for x, y in zip(t, rr, strict=True)]).as_dict()
                for a, t in per_arm.items() if a != "router_round_robin"}

    gains = vs_round_robin(thr)
    # the latency tail beside the throughput: a router that packs heavy requests onto
    # one step can gain tok/s and lose TPOT P95 (docs/peers.md, G = 4 at 256)
    tpot = {a: s["tpot_p95_ms"] for a, s in sims.items()}
    tpot_gains = vs_round_robin(tpot)
    return {"window": n, "windows": k, "spread_s": spread_s, "throughput_tok_s": thr,
            "gain_vs_round_robin_pct": gains, "tpot_p95_ms": tpot,
            "tpot_p95_vs_round_robin_pct": tpot_gains}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--window", default="64", help="comma list of window sizes")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--spread", default="0", help="comma list of arrival spans, seconds")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"trace": a.trace, "replicas": a.replicas, "slots": a.slots,
           "options": "outputs clipped to 128, prompts to 16384, engine.slowdown=2, saturated",
           "cells": []}
    sizes = [int(x) for x in a.window.split(",")]
    for n, sp in product(sizes, (float(x) for x in a.spread.split(","))):
        c = cell(a.trace, a.replicas, a.slots, n, a.windows, a.seeds, sp)
        out["cells"].append(c)
        print(f"G={a.replicas} slots={a.slots} window={n} spread={sp:g} s:")
        for arm, gd in c["gain_vs_round_robin_pct"].items():
            ci = gd["ci95"]
            line = f"  {arm:22s} tok/s {gd['mean']:+6.1f}% [{ci[0]:+.1f}, {ci[1]:+.1f}]"
            if (td := c["tpot_p95_vs_round_robin_pct"].get(arm)) is not None:
                tc = td["ci95"]
                line += f"   TPOT P95 {td['mean']:+6.1f}% [{tc[0]:+.1f}, {tc[1]:+.1f}]"
            print(line)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
