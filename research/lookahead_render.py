"""Render issue 14's look-ahead ensembles (``algo_explore.py --json`` files) as tables.

Each input is one cell (workload x G x mode) of paired windows. For every cell and
measurement window (saturated: the steady window and the whole run; stationary: its
window; trace: the whole run) this prints br0's and brh+oracle's gains over jsq, their
ratio, the honest BR-H's (and the oracle's) paired difference to br0, and the headroom
shares (sum over windows of ``thr - thr_jsq`` over the sum of ``bound - thr_jsq``).

Usage::

    python -m research.lookahead_render results/lookahead/*.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

WINDOWS = {
    "saturated": [("throughput_tok_s", "balanced_bound_tok_s", "steady"),
                  ("whole_thr", "whole_bound", "whole")],
    "stationary": [("stat_thr", "stat_bound", "stationary")],
    "trace": [("throughput_tok_s", "balanced_bound_tok_s", "whole")],
}


def _mean_se(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs, dtype=np.float64)
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float("nan")
    return 100 * float(a.mean()), 100 * se


def cell_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measurement window of the cell, with the paired statistics."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in doc["rows"]:
        by.setdefault(r["label"], {})[r["window"]] = r
    args = doc["args"]
    out = []
    for thr, bound, name in WINDOWS[args["mode"]]:
        jsq, br0 = by["jsq"], by["br0"]
        ks = sorted(jsq)

        def gain(lab: str, ref: dict[int, dict[str, Any]], thr: str = thr,
                 ks: list[int] = ks) -> tuple[float, float]:
            return _mean_se([by[lab][k][thr] / ref[k][thr] - 1 for k in ks])

        def share(lab: str, thr: str = thr, bound: str = bound, ks: list[int] = ks,
                  jsq: dict[int, dict[str, Any]] = jsq) -> float:
            used = sum(by[lab][k][thr] - jsq[k][thr] for k in ks)
            room = sum(by[lab][k][bound] - jsq[k][thr] for k in ks)
            return 100 * used / room if room > 0 else float("nan")

        mode = args["mode"] + (f" {args['load']:.0%}" if args["mode"] == "trace" else "")
        if args["seed"]:
            mode += f" (held out: seed {args['seed']})"
        row = {"workload": args["workload"], "G": args["replicas"], "mode": mode,
               "window": name, "K": len(ks), "N": args["requests"],
               "gain": {lab: gain(lab, jsq) for lab in by},
               "vs_br0": {lab: gain(lab, br0) for lab in by},
               "share": {lab: share(lab) for lab in by}}
        out.append(row)
    return out


def fmt(t: tuple[float, float]) -> str:
    return f"{t[0]:+.1f} ± {t[1]:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    a = p.parse_args()
    rows = [r for f in a.files for r in cell_rows(json.loads(f.read_text()))]
    print("| workload | G | mode, window | br0 over jsq | brh+oracle over jsq | ratio "
          "| survival vs br0 | exact vs br0 | oracle vs br0 | share br0 / survival / "
          "oracle |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        g, v, s = r["gain"], r["vs_br0"], r["share"]
        b, o = g["br0"][0], g["brh+oracle"][0]
        ratio = f"{o / b:.2f}" if b > 0 else "-"
        ex = fmt(v["brh+exact"]) if "brh+exact" in v else "-"
        print(f"| {r['workload']} | {r['G']} | {r['mode']}, {r['window']} | "
              f"{fmt(g['br0'])} | {fmt(g['brh+oracle'])} | {ratio} | "
              f"{fmt(v['brh+survival'])} | {ex} | {fmt(v['brh+oracle'])} | "
              f"{s['br0']:.1f} / {s['brh+survival']:.1f} / {s['brh+oracle']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
