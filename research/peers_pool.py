"""Pool several ``bench-peers`` runs of one cell into one paired ensemble.

    python -m research.peers_pool RESULT.json RESULT.json ... [--json OUT]

A replication on fresh windows is a second sample of the same question; reading the two
intervals apart undersells both. This pools the saturated runs of every file, each
window a pair (the graph against each router on that window), and prints the graph's
paired gain over each router and over the best of them on the pooled windows (mean
[95% t], :func:`br_serve.sim.stats.paired`), for output tok/s, TPOT P95 and TTFT P50.

Refused: files of different cells (trace, window size, clipping, replicas, slots,
engine slowdown or arms differ), and a window start that two files share (it would
count twice). Pooling is honest only when the product path did not change between the
runs; the files' commits are not stored in them, so say which in the manifest.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired

METRICS = (("output tok/s", "output_tok_s"), ("TPOT P95", "tpot_p95_ms"),
           ("TTFT P50", "ttft_p50_ms"))


def _cell(cfg: dict[str, Any]) -> tuple[Any, ...]:
    g = cfg["graph"]
    return (cfg["trace"], cfg["window"], cfg["max_output"], cfg["max_prompt"],
            g["replicas"], g["slots"], g["engine"]["slowdown"],
            tuple(a[1] for a in cfg["arms"]))


def pool(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``{windows, window_starts, gains: {router: {metric: paired}}, best_router,
    means: {arm: output tok/s}}`` over the saturated runs of ``results``."""
    cells = {_cell(r["config"]) for r in results}
    if len(cells) != 1:
        raise ValueError(f"not one cell: {sorted(map(str, cells))}")
    by: dict[str, dict[int, dict[str, Any]]] = {}
    starts: list[int] = []
    for r in results:
        ws = r["config"]["window_starts"]
        if dup := set(ws) & set(starts):
            raise ValueError(f"window starts {sorted(dup)} appear in two files")
        for run in r["runs"]:
            m = run["measured"]
            if run["mode"] != "saturated" or "failed" in m:
                continue
            by.setdefault(run["arm"], {})[ws[run["window"]]] = m
        starts += ws
    graph = next(a for a in by if a.startswith("graph"))
    routers = [a for a in by if a != graph]

    def mean(a: str) -> float:
        return float(sum(m["output_tok_s"] for m in by[a].values())) / len(by[a])

    best = max(routers, key=mean)
    gains = {}
    for base in routers:
        common = sorted(by[graph].keys() & by[base].keys())
        gains[base] = {label: paired([100 * (by[graph][w][k] / by[base][w][k] - 1)
                                      for w in common]).as_dict()
                       for label, k in METRICS}
    return {"windows": len(starts), "window_starts": starts, "gains": gains,
            "best_router": best, "means": {a: mean(a) for a in by}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="bench-peers JSON files of one cell")
    ap.add_argument("--json", help="write the pooled result here")
    a = ap.parse_args()
    out = pool([json.loads(Path(p).read_text()) for p in a.results])
    out["files"] = a.results
    print(f"{out['windows']} windows; best router on them: {out['best_router']}")
    for arm, v in out["means"].items():
        print(f"  {arm:20s} {v:7.1f} output tok/s")
    for base, g in out["gains"].items():
        for label, d in g.items():
            lo, hi = d["ci95"]
            print(f"  graph vs {base:18s} {label:12s} {d['mean']:+6.1f}% "
                  f"[{lo:+.1f}, {hi:+.1f}] n={d['n']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
