"""Paired gains of one label over another in ``br-serve sim`` summaries.

For each ``DIR/summary.json`` and each ``A:B`` pair: the whole-run (generated tokens /
makespan) and steady-window throughput of A over B, per window, as mean and 95%
t-interval (``br_serve.sim.stats.paired``). Used for never-worse checks (brh against
br0) and option checks where no jsq baseline ran.

    python research/policy/pair_runs.py OUT_JSON --pair A:B [--pair C:D] DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired


def _stat(xs: list[float]) -> dict[str, Any]:
    p = paired(xs)
    return {"mean": p.mean, "ci95": None if p.ci95 is None else list(p.ci95), "k": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--pair", action="append", required=True, help="A:B")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    for d in a.dirs:
        runs = json.loads((Path(d) / "summary.json").read_text())["runs"]
        by: dict[str, dict[int, dict[str, Any]]] = {}
        for r in runs:
            by.setdefault(r["label"], {})[r["replay"]] = r
        cell: dict[str, Any] = {}
        for pair in a.pair:
            x, y = pair.split(":")
            if x not in by or y not in by:
                continue
            ks = sorted(set(by[x]) & set(by[y]))
            cell[pair] = {key: _stat([by[x][k][key] / by[y][k][key] - 1 for k in ks])
                          for key in ("whole_run_throughput_tok_s", "throughput_tok_s")}
            w, s = cell[pair]["whole_run_throughput_tok_s"], cell[pair]["throughput_tok_s"]
            print(f"{Path(d).name} {pair}: whole run {100 * w['mean']:+.1f}% "
                  f"[{100 * w['ci95'][0]:+.1f}, {100 * w['ci95'][1]:+.1f}], steady "
                  f"{100 * s['mean']:+.1f}% [{100 * s['ci95'][0]:+.1f}, {100 * s['ci95'][1]:+.1f}]")
        out[Path(d).name] = cell
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
