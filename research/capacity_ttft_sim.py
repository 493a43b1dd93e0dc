"""Research (issues 27/28): which request waits at a TTFT-bound capacity, in the model.

Live (docs/peers.md, "Capacity at the SLO, live, same session"), on the Mooncake G = 8
windows of 64 the graph's TTFT P95 climbs past 10 s at a lower arrival scale than smg's
round robin, while its steps are as good or better. This replays the same windows in the
simulator, arrival-timed at each scale of ``--scales`` (the window's own arrivals divided
by the scale, as ``bench-peers --timed-scales`` does), for the routers' round robin (bound
at arrival, the engine queues) and for each br0 variant of ``--variants`` at dispatch
ahead ``--depth`` (the graph's default 2), and prints per arm and scale the windows' TTFT
P95, TPOT P95 and output tok/s, and per arm and window the capacity: the highest scale of
the grid below the first one that misses the SLO (TPOT P95 <= ``--tpot-ms``, TTFT P95 <=
``--ttft-s``), with each arm's capacity paired by window against round robin's and
the first variant's (mean [95% t] of the per-window ratios; a window where the
reference met the SLO at no scale of the grid has no ratio). ``--tpot-ms 1e9`` gives the
TTFT-bound capacity alone (on these windows the TPOT bound sits inside every arm's
plateau, docs/peers.md).

A variant is ``label=policy[:key=value;key=value]`` (values parsed as JSON, ``null`` for
None), e.g. ``fifo_budget=br0:ttft_budget_backlog_s=null``.

    PYTHONPATH=. python -m research.capacity_ttft_sim --trace T --replicas 8 --slots 4 \\
        --window 64 [--scales 1.0,1.2,...] [--variants ...] [--json OUT]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from br_serve.bench.serve_report import simulate_one
from br_serve.serve.config import parse_graph_config
from br_serve.sim.stats import paired
from br_serve.traces import Trace
from research.peers_common import bench_cell, cell_parser

METRICS = ("ttft_p95_ms", "ttft_p50_ms", "tpot_p95_ms", "throughput_tok_s")


def parse_variant(text: str) -> tuple[str, str, dict[str, Any]]:
    """``label=policy[:k=v;k=v]`` -> (label, policy, options)."""
    label, _, rest = text.partition("=")
    policy, _, opts = rest.partition(":")
    options = {}
    for kv in filter(None, opts.split(";")):
        k, _, v = kv.partition("=")
        options[k] = json.loads(v)
    return label, policy, options


def spread(arrival_s: list[float], spread_s: float) -> list[float]:
    """Arrivals with each run of equal timestamps spread ``spread_s`` apart, in order:
    a clump the client sends at once reaches the live pool one request at a time."""
    out: list[float] = []
    for i, a in enumerate(arrival_s):
        out.append(out[-1] + spread_s if i and a == arrival_s[i - 1] else a)
        if i and out[-1] < out[-2]:
            out[-1] = out[-2]
    return out


def run_arm(base: Any, windows: list[Any], policy: str, options: dict[str, Any],
            engine_queue: int, scales: list[float], spread_s: float = 0.0,
            per_delivery: bool = False) -> dict[float, list[dict[str, Any]]]:
    """{scale: [per-window metrics]} for one arm (``spread_s``: see :func:`spread`;
    ``per_delivery``: ``sim.tick_per_delivery``)."""
    cfg = parse_graph_config(base, policy={"name": policy, "options": options})
    out: dict[float, list[dict[str, Any]]] = {}
    for s in scales:
        rows = []
        for w in windows:
            trace = Trace.build(spread([a / s for a in w.arrival_s], spread_s),
                                list(w.prompt_tokens),
                                list(w.output_tokens))
            r = simulate_one(trace, cfg, engine_queue=engine_queue,
                             tick_per_delivery=per_delivery)
            rows.append({k: r.get(k) for k in METRICS})
        out[s] = rows
    return out


def capacity(per_scale: dict[float, list[dict[str, Any]]], w: int, tpot_ms: float,
             ttft_s: float) -> tuple[float, str]:
    """(highest scale below the first miss, what missed) for window ``w``."""
    best, why = 0.0, "met at every scale"
    for s in sorted(per_scale):
        r = per_scale[s][w]
        miss = [m for m, bad in (("TTFT", r["ttft_p95_ms"] > 1e3 * ttft_s),
                                 ("TPOT", r["tpot_p95_ms"] > tpot_ms)) if bad]
        if miss:
            why = f"{'+'.join(miss)} at {s:g}"
            break
        best = s
    return best, why


def main() -> None:
    ap = cell_parser(__doc__)
    ap.add_argument("--scales", default="1.0,1.2,1.4,1.5,1.6,1.7,1.8,1.9,2.0,2.1,2.2,2.3,"
                                        "2.4,2.5")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--variants", nargs="*", default=["br0=br0"])
    ap.add_argument("--tpot-ms", type=float, default=115.6)
    ap.add_argument("--ttft-s", type=float, default=10.0)
    ap.add_argument("--spread-ms", type=float, default=0.0,
                    help="spread each clump of equal arrival times this far apart")
    ap.add_argument("--tick-per-delivery", action="store_true",
                    help="the policy ticks once per request landing in the pool, as live")
    ap.add_argument("--json")
    a = ap.parse_args()
    scales = [float(x) for x in a.scales.split(",")]
    base, windows = bench_cell(a.trace, a.replicas, a.slots, a.window, a.windows)
    arms: dict[str, tuple[str, dict[str, Any], int]] = {
        "round_robin": ("router_round_robin", {}, 0)}
    for v in a.variants:
        label, pol, opts = parse_variant(v)
        arms[label] = (pol, opts, a.depth)
    res: dict[str, Any] = {}
    for label, (pol, opts, q) in arms.items():
        per = run_arm(base, windows, pol, opts, q, scales, a.spread_ms / 1e3,
                      a.tick_per_delivery)
        caps = [capacity(per, i, a.tpot_ms, a.ttft_s) for i in range(len(windows))]
        res[label] = {"policy": pol, "options": opts, "engine_queue": q,
                      "per_scale": {str(s): rows for s, rows in per.items()},
                      "capacity_scale": [c for c, _ in caps], "why": [y for _, y in caps]}
        print(f"{label}: capacity {[c for c, _ in caps]} ({'; '.join(y for _, y in caps)})")
        for s in scales:
            rows = per[s]
            print(f"  x{s:g}: TTFT P95 " + " ".join(f"{r['ttft_p95_ms'] / 1e3:5.2f}"
                                                   for r in rows)
                  + "  TPOT P95 " + " ".join(f"{r['tpot_p95_ms']:5.1f}" for r in rows))
    # paired against round robin and against the first variant
    first = next((k for k in arms if k != "round_robin"), None)
    for base_label in ("round_robin", first):
        ref = res[base_label]["capacity_scale"] if base_label else []
        for label, r in res.items():
            if label in ("round_robin", base_label) or not base_label:
                continue
            # a window where the reference met the SLO at no scale has no ratio
            g = paired([(c - b) / b for c, b in zip(r["capacity_scale"], ref, strict=True)
                        if b > 0]).as_dict()
            r[f"capacity_vs_{base_label}"] = g
            print(f"{label} vs {base_label}: {100 * g['mean']:+.1f}% "
                  f"[{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]")
    if a.json:
        Path(a.json).write_text(json.dumps({"config": vars(a), "arms": res}, indent=2) + "\n")


if __name__ == "__main__":
    main()
