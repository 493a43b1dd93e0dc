"""Research (issues 27/28): a ``bench-peers --timed-scales`` result read per window, the
graph against a router at the same arrival rate, beside the simulator's prediction.

For each timed scale and window both arms ran, prints the graph's and the router's TTFT
P95, TTFT P50, TPOT P95 and output tok/s, and the paired means over windows of the
ratios graph / router - 1 (``sim.stats.paired``: mean, 95% t-interval). With ``--sim``
(a ``research/capacity_ttft_sim.py`` JSON of the same windows: same trace, K, window
and cell, checked) each window's simulated TTFT P95 at the same scale is set beside it,
for the router's model (``round_robin``) and the graph's (``--sim-arm``), with the
paired live-minus-model gaps: where the live graph is slower than its model and the
router is not, the difference is the graph's path, not its policy.

    PYTHONPATH=. python -m research.timed_pairs results/peers/X.json [--arm graph:br0] \\
        [--base smg:round_robin] [--sim results/policy/Y.json --sim-arm br0] [--out OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired

METRICS = ("ttft_p95_ms", "ttft_p50_ms", "tpot_p95_ms", "output_tok_s")


def _pct(values: list[float]) -> dict[str, Any]:
    d = paired(values).as_dict()
    return {"mean_pct": 100 * d["mean"], "ci95_pct": [100 * x for x in d["ci95"]],
            "n": len(values)}


def _sec(values: list[float]) -> dict[str, Any]:
    d = paired(values).as_dict()
    return {"mean_s": d["mean"], "ci95_s": d["ci95"], "n": len(values)}


def pairs(result: dict[str, Any], arm: str, base: str) -> dict[float, list[dict[str, Any]]]:
    """{scale: [{window, arm: {metric}, base: {metric}}]} over the timed runs both
    arms completed without a lost request."""
    runs: dict[tuple[float, int, str], dict[str, Any]] = {}
    for r in result["runs"]:
        m = r["measured"]
        if r["mode"] == "timed" and not m.get("failed") and m.get("requests_lost") == 0:
            runs[(r["rate_scale"], r["window"], r["arm"])] = m
    out: dict[float, list[dict[str, Any]]] = {}
    for (scale, w, a), m in sorted(runs.items()):
        o = runs.get((scale, w, base))
        if a == arm and o is not None:
            out.setdefault(scale, []).append({
                "window": w, "arm": {k: m.get(k) for k in METRICS},
                "base": {k: o.get(k) for k in METRICS}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result")
    ap.add_argument("--arm", default="graph:br0")
    ap.add_argument("--base", default="smg:round_robin")
    ap.add_argument("--sim")
    ap.add_argument("--sim-arm", default="br0")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = json.loads(Path(a.result).read_text())
    sim = json.loads(Path(a.sim).read_text()) if a.sim else None
    if sim is not None:
        c, s = res["config"], sim["config"]
        if (c["trace"], c["windows"], c["window"], c["graph"]["replicas"],
                c["graph"]["slots"]) != (s["trace"], s["windows"], s["window"],
                                         s["replicas"], s["slots"]):
            raise SystemExit(f"--sim {a.sim}: not the windows of {a.result}")
    out: dict[str, Any] = {"result": a.result, "arm": a.arm, "base": a.base,
                           "sim": a.sim, "scales": {}}
    for scale, rows in pairs(res, a.arm, a.base).items():
        print(f"x{scale:g}: window  TTFT P95 s (graph / router"
              + (" | model graph / router)" if sim else ")") + "  TTFT P50 s  TPOT P95 ms")
        for r in rows:
            g, b = r["arm"], r["base"]
            line = (f"  {r['window']:2d}  {g['ttft_p95_ms'] / 1e3:5.2f} / "
                    f"{b['ttft_p95_ms'] / 1e3:5.2f}")
            if sim is not None:
                per = sim["arms"]
                row_g = per[a.sim_arm]["per_scale"][str(scale)][r["window"]]
                row_b = per["round_robin"]["per_scale"][str(scale)][r["window"]]
                r["model"] = {"arm_ttft_p95_ms": row_g["ttft_p95_ms"],
                              "base_ttft_p95_ms": row_b["ttft_p95_ms"],
                              "arm_ttft_p50_ms": row_g["ttft_p50_ms"],
                              "base_ttft_p50_ms": row_b["ttft_p50_ms"]}
                line += (f" | {row_g['ttft_p95_ms'] / 1e3:5.2f} / "
                         f"{row_b['ttft_p95_ms'] / 1e3:5.2f}")
            line += (f"  {g['ttft_p50_ms'] / 1e3:4.2f} / {b['ttft_p50_ms'] / 1e3:4.2f}"
                     f"  {g['tpot_p95_ms']:5.1f} / {b['tpot_p95_ms']:5.1f}")
            print(line)
        summary = {k: _pct([r["arm"][k] / r["base"][k] - 1 for r in rows]) for k in METRICS}
        if sim is not None:
            for q in ("p95", "p50"):
                summary[f"live_minus_model_ttft_{q}_s"] = {
                    side: _sec([(r[side][f"ttft_{q}_ms"] - r["model"][f"{side}_ttft_{q}_ms"])
                                / 1e3 for r in rows]) for side in ("arm", "base")}
        for k, v in summary.items():
            if k.startswith("live_minus_model_"):
                for side, d in v.items():
                    print(f"  live - model TTFT {k.split('_')[-2].upper()}, {side}: "
                          f"{d['mean_s']:+.2f} s [{d['ci95_s'][0]:+.2f}, {d['ci95_s'][1]:+.2f}]")
            else:
                print(f"  {k}: graph vs router {v['mean_pct']:+.1f}% "
                      f"[{v['ci95_pct'][0]:+.1f}, {v['ci95_pct'][1]:+.1f}] (n = {v['n']})")
        out["scales"][str(scale)] = {"pairs": rows, "summary": summary}
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
