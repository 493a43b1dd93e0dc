"""Research: where a live capacity difference comes from, read at equal rates.

A ``bench-peers --capacity`` result stores every run of each (arm, window) search. Where
two arms ran the same window at the same arrival-rate multiplier, their TPOT P95 and
TTFT P95 can be paired directly, without the search's threshold: this says whether an
arm carries more because its TPOT stays lower (balance), because its TTFT stays lower
(queueing), or both. Prints one line per shared (window, scale) and the paired means
(``sim.stats.paired``: mean of per-pair ratios, 95% t-interval), and writes JSON.

    python research/capacity_equal_rate.py results/peers/mooncake_g8_capacity.json \
        --arm graph:br0 --base smg:round_robin --out results/peers/mooncake_g8_equal_rate.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired


def equal_rate(result: dict[str, Any], arm: str, base: str,
               protocol: str = "sglang") -> dict[str, Any]:
    """Pairs of (window, scale) that both arms ran, and the paired ratios arm/base - 1
    of TPOT P95 and TTFT P95 over those where both runs completed."""
    rows = {r["arm"]: r for r in result["capacity"] if r["protocol"] == protocol}
    pairs = []
    for wa, wb in zip(rows[arm]["per_window"], rows[base]["per_window"], strict=True):
        eb = {round(e["scale"], 9): e for e in wb["evaluations"]}
        for e in wa["evaluations"]:
            o = eb.get(round(e["scale"], 9))
            if o is None or e.get("tpot_p95_ms") is None or o.get("tpot_p95_ms") is None:
                continue
            pairs.append({"window": wa["window"], "scale": e["scale"],
                          "tpot_p95_ms": [e["tpot_p95_ms"], o["tpot_p95_ms"]],
                          "ttft_p95_s": [e["ttft_p95_s"], o["ttft_p95_s"]],
                          "meets": [e["meets"], o["meets"]]})

    def gain(key: str) -> dict[str, Any]:
        return paired([p[key][0] / p[key][1] - 1.0 for p in pairs]).as_dict()

    return {"arm": arm, "base": base, "protocol": protocol, "slo": result.get("slo"),
            "pairs": pairs, "tpot_p95": gain("tpot_p95_ms"), "ttft_p95": gain("ttft_p95_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--arm", default="graph:br0")
    ap.add_argument("--base", default="smg:round_robin")
    ap.add_argument("--protocol", default="sglang")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    out = equal_rate(json.loads(a.result.read_text()), a.arm, a.base, a.protocol)
    for p in out["pairs"]:
        print(f"window {p['window']} x{p['scale']:.3g}: TPOT P95 "
              f"{p['tpot_p95_ms'][0]:.1f} vs {p['tpot_p95_ms'][1]:.1f} ms, TTFT P95 "
              f"{p['ttft_p95_s'][0]:.2f} vs {p['ttft_p95_s'][1]:.2f} s, meets {p['meets']}")
    for k in ("tpot_p95", "ttft_p95"):
        g = out[k]
        ci = g["ci95"] or [float("nan")] * 2
        print(f"{a.arm} vs {a.base}, {k} at equal rate: {100 * g['mean']:+.1f}% "
              f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] (n = {g['n']})")
    if a.out:
        a.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
