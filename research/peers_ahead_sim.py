"""Research (issue 28): the graph's dispatch ahead in the simulator, on bench-peers'
saturated windows.

Live, the graph in front of SGLang or vLLM engines runs with ``pool.dispatch_ahead``
resolved to 2 (each rank holds ``slots`` running requests and 2 queued at its engine).
This replays the bench's windows (``research/peers_common``: outputs clipped to 128,
prompts to 16384, ``engine.slowdown=2``, the whole window at t = 0) with br0 at each
``d`` in ``--depths`` (``sim.dispatch_ahead = d``: a FIFO queue of ``d`` per rank,
places offered as the graph's scheduler offers them), against the routers' round robin
(``router_round_robin``, bound at arrival). Output tok/s is tokens over makespan. Prints
per depth the paired gain over round robin (mean [95% t]) and the mean per-step
imbalance.

    python -m research.peers_ahead_sim --trace T --replicas G --slots S --window N \\
        [--windows K] [--depths 0,1,2] [--json OUT]
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from br_serve.serve.config import parse_graph_config
from br_serve.sim import parse_sim_config, simulate
from br_serve.sim.config import with_dispatch_ahead
from br_serve.sim.stats import paired
from br_serve.traces import Trace
from research.peers_common import SETTINGS, bench_cell, cell_parser


def run(w: Any, g: int, slots: int, policy: str, d: int) -> dict[str, float]:
    """One window, whole at t = 0: output tok/s and mean per-step imbalance."""
    m = parse_graph_config({"replicas": str(g), "slots": str(slots),
                            "engine_slowdown": SETTINGS["engine.slowdown"]}
                           ).router_step_model()
    over: dict[str, Any] = {"replicas": g, "slots": slots, "step": m,
                            "policy": {"name": policy, "options": {}},
                            "sim": {"saturated": True}}
    over = with_dispatch_ahead(over, d)
    tr = Trace.build([0.0] * len(w.prompt_tokens), list(w.prompt_tokens),
                     list(w.output_tokens))
    s = simulate(tr, parse_sim_config(over)).summary()
    return {"output_tok_s": float(sum(w.output_tokens) / s["makespan_s"]),
            "imbalance_tokens": float(s["mean_imbalance_tokens"])}


def main() -> None:
    ap = cell_parser(__doc__)
    ap.add_argument("--depths", default="0,1,2", help="comma list of dispatch-ahead depths")
    ap.add_argument("--json")
    a = ap.parse_args()
    depths = [int(x) for x in a.depths.split(",")]
    if any(d < 0 for d in depths):
        ap.error(f"--depths: must be >= 0 (got {a.depths})")
    _, ws = bench_cell(a.trace, a.replicas, a.slots, a.window, a.windows)
    rr = [run(w, a.replicas, a.slots, "router_round_robin", 0) for w in ws]
    out: dict[str, Any] = {"trace": a.trace, "replicas": a.replicas, "slots": a.slots,
                           "window": a.window, "windows": a.windows,
                           "router_round_robin": rr, "br0": {}}
    print(f"G={a.replicas} slots={a.slots} window={a.window} K={a.windows}: round robin "
          f"imbalance {statistics.mean(r['imbalance_tokens'] for r in rr):.0f} tok")
    for d in depths:
        b = [run(w, a.replicas, a.slots, "br0", d) for w in ws]
        gain = paired([100 * (x["output_tok_s"] / y["output_tok_s"] - 1)
                       for x, y in zip(b, rr, strict=True)]).as_dict()
        out["br0"][str(d)] = {"runs": b, "gain_vs_round_robin_pct": gain}
        lo, hi = gain["ci95"] if gain["ci95"] else (gain["mean"], gain["mean"])
        print(f"  br0 d={d}: {gain['mean']:+6.1f}% [{lo:+.1f}, {hi:+.1f}] over round robin, "
              f"imbalance {statistics.mean(x['imbalance_tokens'] for x in b):.0f} tok")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
