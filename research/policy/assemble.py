"""Assemble the saturated matrix (research/policy/matrix.sh) into one results file.

Per cell (workload x G): whole-run gain over ``jsq`` (generated tokens / makespan,
paired per window, mean and 95% t-interval) of the default ``br0``, of the previous
default (``abs30``: 30 s beyond FCFS, absolute) and of ``br0`` with ageing off; the
ratio default / off; TTFT P95 relative to jsq's (paired); and the fairness realised
against jsq's replay of the same window (jsq serves the pool in FCFS order): P99 and
max over requests of ``TTFT - TTFT_fcfs`` and of ``TTFT - 2 x TTFT_fcfs``.

    python research/policy/assemble.py MATRIX_DIR OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired


def _by(runs: list[dict[str, Any]], label: str) -> dict[int, dict[str, Any]]:
    return {r["replay"]: r for r in runs if r["label"] == label}


def _stat(xs: list[float]) -> dict[str, Any]:
    p = paired(xs)
    return {"mean": p.mean, "se": p.se, "ci95": None if p.ci95 is None else list(p.ci95),
            "k": len(xs)}


def cell(doc: dict[str, Any]) -> dict[str, Any]:
    runs = doc["runs"]
    base = _by(runs, "jsq")
    out: dict[str, Any] = {}
    for lab in ("br0", "abs30", "off"):
        mine = _by(runs, lab)
        keys = sorted(set(mine) & set(base))
        gains = [mine[k]["whole_run_throughput_tok_s"] / base[k]["whole_run_throughput_tok_s"]
                 - 1 for k in keys]
        ttft = [mine[k]["ttft_p95_ms"] / base[k]["ttft_p95_ms"] - 1 for k in keys]
        row = {"whole_run_gain": _stat(gains), "ttft_p95_vs_jsq": _stat(ttft)}
        for m in ("fcfs_replay_delay_s_p99", "fcfs_replay_delay_s_max",
                  "fcfs_rule_excess_s_p99", "fcfs_rule_excess_s_max",
                  "wait_beyond_fcfs_s_p99"):
            vals = [mine[k][m] for k in keys]
            row[m] = {"mean": sum(vals) / len(vals), "max": max(vals)}
        out[lab] = row
    off = out["off"]["whole_run_gain"]["mean"]
    out["ratio_default_to_off"] = out["br0"]["whole_run_gain"]["mean"] / off if off else None
    return out


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    cells = {}
    for f in sorted(src.glob("*/summary.json")):
        cells[f.parent.name] = cell(json.loads(f.read_text()))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps({"cells": cells}, indent=2))
    print("| cell | br0 default | abs 30 s (old) | ageing off | ratio | TTFT P95 vs jsq | "
          "TTFT - FCFS P99 / max s | TTFT - 2xFCFS P99 / max s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, c in cells.items():
        def g(lab: str, c: dict[str, Any] = c) -> str:
            s = c[lab]["whole_run_gain"]
            lo, hi = s["ci95"] or (float("nan"), float("nan"))
            return f"{100 * s['mean']:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        b = c["br0"]
        t = b["ttft_p95_vs_jsq"]
        print(f"| {name} | {g('br0')} | {g('abs30')} | {g('off')} | "
              f"{100 * (c['ratio_default_to_off'] or 0):.0f}% | {100 * t['mean']:+.1f}% "
              f"± {100 * (t['se'] or 0):.1f} | "
              f"{b['fcfs_replay_delay_s_p99']['mean']:.0f} / "
              f"{b['fcfs_replay_delay_s_max']['max']:.0f} | "
              f"{b['fcfs_rule_excess_s_p99']['mean']:.0f} / "
              f"{b['fcfs_rule_excess_s_max']['max']:.0f} |")


if __name__ == "__main__":
    main()
