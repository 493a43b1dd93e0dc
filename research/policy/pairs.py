"""Whole-run paired gains of every label against a baseline, from ``br-serve sim``
ensemble outputs (summary.json): per label the mean, s.e. and 95% t-interval over
windows of ``whole_run_throughput_tok_s / baseline's - 1`` and of the TTFT P95 ratio,
plus the FCFS-replay fairness columns (meaningful when the baseline is jsq).

    python research/policy/pairs.py BASELINE OUT_JSON SUMMARY_JSON...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired


def pairs(doc: dict[str, Any], baseline: str) -> dict[str, Any]:
    runs = doc["runs"]
    base = {r["replay"]: r for r in runs if r["label"] == baseline}
    out: dict[str, Any] = {}
    for lab in sorted({r["label"] for r in runs} - {baseline}):
        mine = {r["replay"]: r for r in runs if r["label"] == lab}
        keys = sorted(set(mine) & set(base))
        row: dict[str, Any] = {}
        for name, f in (("whole_run_gain", "whole_run_throughput_tok_s"),
                        ("steady_gain", "throughput_tok_s"),
                        ("ttft_p95_vs_baseline", "ttft_p95_ms")):
            p = paired([mine[k][f] / base[k][f] - 1 for k in keys])
            row[name] = {"mean": p.mean, "se": p.se,
                         "ci95": None if p.ci95 is None else list(p.ci95), "k": len(keys)}
        for m in ("fcfs_replay_delay_s_p99", "fcfs_replay_delay_s_max",
                  "fcfs_rule_excess_s_p99", "fcfs_rule_excess_s_max"):
            vals = [mine[k].get(m) for k in keys]
            row[m] = vals
        row["policy_options"] = next(e["policy_options"] for e in doc["ensemble"]
                                     if e["label"] == lab)
        out[lab] = row
    return out


def main() -> None:
    baseline, dst = sys.argv[1], Path(sys.argv[2])
    res = {Path(f).parent.name: pairs(json.loads(Path(f).read_text()), baseline)
           for f in sys.argv[3:]}
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps({"baseline": baseline, "cells": res}, indent=2))
    for cell, rows in res.items():
        for lab, r in rows.items():
            g = r["whole_run_gain"]
            print(f"{cell} {lab}: whole run {100 * g['mean']:+.1f} ± "
                  f"{100 * (g['se'] or 0):.1f}% vs {baseline}")


if __name__ == "__main__":
    main()
