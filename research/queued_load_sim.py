"""Research: which load br0 should balance when requests wait in the engines' queues
(``pool.dispatch_ahead``), simulated on the bench's windows (issue 28).

The simulated ranks run ``slots`` requests and queue ``d`` more in binding order
(``sim.dispatch_ahead = d``: places offered as the graph's scheduler offers them, free
engine slots first and queue places for a backlog only); the snapshot tells the queued
ones apart. Per window and arm: output tok/s and the
mean per-step imbalance (max - mean of the loads the steps computed with). ``d0`` has
no queue (a freed slot is refilled at once: the simulator has no turnover delay).

    nice -n 19 .venv/bin/python research/queued_load_sim.py \
        --trace ../shared/traces/servegen/deepseek_r1_5rps_1h.csv --replicas 4 --slots 4
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from br_serve.bench import peers
from br_serve.sim import parse_sim_config, simulate
from br_serve.sim.config import with_dispatch_ahead
from br_serve.sim.stats import paired
from br_serve.traces import Trace

RULES = ("bound", "running", "entry")


def run(w: peers.Window, g: int, slots: int, d: int, rule: str, slowdown: float
        ) -> dict[str, float]:
    from br_serve.serve.config import parse_graph_config

    cfg = parse_graph_config({"replicas": str(g), "slots": str(slots),
                              "engine_slowdown": str(slowdown)})
    m = cfg.router_step_model()
    over = {"replicas": g, "slots": slots, "step": m,
            "policy": {"name": "br0", "options": {"queued_load": rule}},
            "sim": {"saturated": True}}
    over = with_dispatch_ahead(over, d)
    scfg = parse_sim_config(over)
    tr = Trace.build([0.0] * len(w.prompt_tokens), list(w.prompt_tokens),
                     list(w.output_tokens))
    s = simulate(tr, scfg).summary()
    return {"tok_s": float(s["throughput_tok_s"]),
            "imbalance": float(s["mean_imbalance_tokens"])}


def ci(xs: np.ndarray) -> list[float]:
    """``[mean, lo, hi]`` of paired gains (a 95% t-interval; lo = hi = mean for one)."""
    p = paired(xs.tolist())
    lo, hi = p.ci95 if p.ci95 is not None else (p.mean, p.mean)
    return [p.mean, lo, hi]


def fmt(g: list[float]) -> str:
    return f"{100 * g[0]:+.1f}% [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window", type=int, default=48)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=16384)
    ap.add_argument("--depths", default="1,2")
    ap.add_argument("--slowdown", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    wins = peers.windows(args.trace, args.windows, args.window, args.max_prompt,
                         args.max_output)
    arms = [("d0", 0, "bound")] + [(f"d{d}:{r}", d, r) for d in
                                   (int(x) for x in args.depths.split(",")) for r in RULES]
    res: dict[str, list[dict[str, float]]] = {a: [] for a, _, _ in arms}
    for w in wins:
        for a, d, r in arms:
            res[a].append(run(w, args.replicas, args.slots, d, r, args.slowdown))
    print(f"{args.trace} G={args.replicas} slots={args.slots} K={args.windows} x "
          f"{args.window} outputs<={args.max_output} saturated")
    print("| arm | tok/s | imbalance tok | tok/s vs d0 | tok/s vs same d, bound |")
    print("|---|---|---|---|---|")
    summary = {}
    for a, d, _ in arms:
        tok = np.array([x["tok_s"] for x in res[a]])
        imb = np.array([x["imbalance"] for x in res[a]])
        ref0 = np.array([x["tok_s"] for x in res["d0"]])
        refb = np.array([x["tok_s"] for x in res[f"d{d}:bound"]]) if d else ref0
        g0, gb = ci(tok / ref0 - 1), ci(tok / refb - 1)
        summary[a] = {"tok_s": tok.tolist(), "imbalance": imb.tolist(),
                      "vs_d0": g0, "vs_bound": gb}
        print(f"| {a} | {tok.mean():.1f} | {imb.mean():.0f} | {fmt(g0)} | {fmt(gb)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": vars(args), "arms": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
