"""Research (issue 28): the graph's engine queue and turnover under live-like arrival,
set beside the live runs.

Live, a saturated bench window does not reach the graph's pool at t = 0: one window
timed hop by hop reached it within 1.8 s (send -> pool P95 1.79 s,
``results/peers/ttft_servegen_g4_w256.json``). This simulates, on the windows
``bench-peers`` replays for one cell (``research/peers_common``: outputs clipped to 128,
prompts to 16384, ``engine.slowdown=2``), the routers' round robin (bound at arrival)
and br0 at each dispatch-ahead depth in ``--depths`` (``sim.dispatch_ahead``: places
offered as the graph's scheduler offers them), and at depth 0 with each turnover in
``--turnover-steps`` (engine steps from a bind to the first decode: the replica's
report, the tick, the admit and the install; ``sim.admit_delay_steps``), with each
window's requests spread evenly over every ``--spread`` span. Per arm: the paired gain
in output tok/s over round robin (mean [95% t]) and the mean per-step imbalance.

``--live FILE ...`` (``bench-peers`` results of the same cell, K and windows) adds, per
file, the graph's live engine-side gain over round robin (tokens per busy second) and
its live imbalance beside the model of its depth: which depth, spread and turnover the
live graph behaves like.

    PYTHONPATH=. python -m research.peers_arrival_sim --trace T --replicas G --slots S \\
        --window N [--windows K] [--depths 0,2] [--turnover-steps 1,3] [--spread 0,1.8] \\
        [--live results/peers/deep_x.json ...] [--json OUT]
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from br_serve.bench.peers_report import SimArm, simulate_windows
from br_serve.sim.stats import paired
from research.peers_common import bench_cell, cell_parser


def arms(depths: list[int], turnovers: list[int]) -> dict[str, SimArm]:
    """Round robin, br0 at each depth, br0 at depth 0 with each turnover."""
    out = {"round_robin": SimArm("router_round_robin")}
    out.update({f"br0_d{d}": SimArm("br0", engine_queue=d) for d in depths})
    out.update({f"br0_d0_turnover{t}": SimArm("br0", turnover_steps=t)
                for t in turnovers if t > 0})
    return out


def live_rows(path: str, cell: dict[str, Any]) -> dict[str, Any]:
    """The graph's live engine gain over round robin and imbalance in a bench result,
    after checking that it replayed this cell's windows."""
    d = json.loads(Path(path).read_text())
    c = d["config"]
    same = (c["trace"], c["windows"], c["window"], c["graph"]["replicas"],
            c["graph"]["slots"]) == (cell["trace"], cell["windows"], cell["window"],
                                     cell["replicas"], cell["slots"])
    if not same:
        raise SystemExit(f"--live {path}: not this cell's windows")
    ahead = c["graph"]["pool"]["dispatch_ahead"]
    row = next(r for r in d["summary"]
               if r["arm"].startswith("graph:") and r["mode"] == "saturated")
    g = row["engine_gain_vs_round_robin"]
    rr = next(r for r in d["summary"] if r["arm"].endswith(":round_robin")
              and r["mode"] == "saturated" and r["protocol"] == row["protocol"])
    return {"file": path, "dispatch_ahead": 2 if ahead is None else ahead,
            "engine_gain_vs_round_robin_pct": {"mean": 100 * g["mean"],
                                                "ci95": [100 * x for x in g["ci95"]]},
            "imbalance_tokens": row["imbalance tok"],
            "round_robin_imbalance_tokens": rr["imbalance tok"]}


def main() -> None:
    ap = cell_parser(__doc__)
    ap.add_argument("--depths", default="0,2", help="comma list of dispatch-ahead depths")
    ap.add_argument("--turnover-steps", default="", help="comma list, at depth 0")
    ap.add_argument("--spread", default="0,1.8", help="comma list of arrival spans, s")
    ap.add_argument("--live", nargs="*", default=[])
    ap.add_argument("--json")
    a = ap.parse_args()
    depths = [int(x) for x in a.depths.split(",") if x]
    turnovers = [int(x) for x in a.turnover_steps.split(",") if x]
    spreads = [float(x) for x in a.spread.split(",") if x]
    if any(d < 0 for d in depths) or any(t < 0 for t in turnovers):
        ap.error("--depths and --turnover-steps: must be >= 0")
    if any(s < 0 for s in spreads):
        ap.error("--spread: must be >= 0")
    base, ws = bench_cell(a.trace, a.replicas, a.slots, a.window, a.windows)
    cell = {"trace": a.trace, "replicas": a.replicas, "slots": a.slots,
            "window": a.window, "windows": a.windows}
    out: dict[str, Any] = {**cell, "runs": {}, "live": [live_rows(p, cell) for p in a.live]}
    for sp in spreads:
        sims = simulate_windows(base, ws, arms(depths, turnovers), saturated=True,
                                seeds=1, spread_s=sp, say=lambda m: None)
        rr = sims["round_robin"]["throughput_tok_s"]
        rows: dict[str, Any] = {}
        print(f"G={a.replicas} slots={a.slots} window={a.window} K={a.windows} "
              f"spread={sp:g} s: round robin imbalance "
              f"{statistics.mean(sims['round_robin']['mean_imbalance_tokens']):.0f} tok")
        for label, s in sims.items():
            if label == "round_robin":
                continue
            gain = paired([100 * (x / y - 1) for x, y in
                           zip(s["throughput_tok_s"], rr, strict=True)]).as_dict()
            imb = statistics.mean(s["mean_imbalance_tokens"])
            rows[label] = {"gain_vs_round_robin_pct": gain, "imbalance_tokens": imb,
                           "throughput_tok_s": s["throughput_tok_s"]}
            lo, hi = gain["ci95"] if gain["ci95"] else (gain["mean"], gain["mean"])
            print(f"  {label:22s} {gain['mean']:+6.1f}% [{lo:+.1f}, {hi:+.1f}] over round "
                  f"robin, imbalance {imb:.0f} tok")
        out["runs"][f"{sp:g}"] = {"round_robin_imbalance_tokens": statistics.mean(
            sims["round_robin"]["mean_imbalance_tokens"]), "arms": rows}
    for r in out["live"]:
        g = r["engine_gain_vs_round_robin_pct"]
        print(f"live d={r['dispatch_ahead']} ({r['file']}): {g['mean']:+.1f}% "
              f"[{g['ci95'][0]:+.1f}, {g['ci95'][1]:+.1f}] engine tok/busy-s over round "
              f"robin, imbalance {r['imbalance_tokens']:.0f} tok (round robin "
              f"{r['round_robin_imbalance_tokens']:.0f})")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
