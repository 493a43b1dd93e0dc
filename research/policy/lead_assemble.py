"""Assemble research/policy/lead_matrix.sh cells into one results file and a table.

Per cell (workload x G) and per br0 variant: whole-run gain over ``jsq`` (generated
tokens / makespan, paired per window, mean and 95% t-interval), its ratio to the gain
with ageing off (``off``), TTFT P95 relative to jsq's (paired, mean and interval), and
the fairness realised against jsq's replay of the same window (jsq serves the pool in
FCFS order): ``TTFT - 2 x TTFT_fcfs`` per request, its P99 per window (mean, interval,
worst window) and its max over all windows. The rule "TTFT <= 2 x FCFS TTFT + slack"
holds at P99 where the P99 excess is <= the slack. Beside it the same rule on the run's
own release clock (``pace_rule_excess_s``, br_serve/sim/metrics.py: pool wait - 2 x the
FCFS pool wait at the run's own pace), which is what the ageing rule keeps online.
Runs of research/policy/fill_split.py also carry the excess over the start-up fill's
requests and over the rest
(``fill_rule_excess_s_*``, ``rest_rule_excess_s_*``; a last table column).

    python research/policy/lead_assemble.py OUT_JSON MATRIX_DIR [MATRIX_DIR ...]
    (a cell's runs from several MATRIX_DIRs are merged, the first one's kept per label)
        [--labels a,b,...] [--against LABEL]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired


def _by(runs: list[dict[str, Any]], label: str) -> dict[int, dict[str, Any]]:
    return {r["replay"]: r for r in runs if r["label"] == label}


def _stat(xs: list[float]) -> dict[str, Any]:
    p = paired(xs)
    return {"mean": p.mean, "se": p.se, "ci95": None if p.ci95 is None else list(p.ci95),
            "k": len(xs)}


def cell(doc: dict[str, Any], against: str | None = None) -> dict[str, Any]:
    runs = doc["runs"]
    base = _by(runs, "jsq")
    other = None if against is None else _by(runs, against)
    labels = sorted({r["label"] for r in runs} - {"jsq"})
    out: dict[str, Any] = {}
    for lab in labels:
        mine = _by(runs, lab)
        keys = sorted(set(mine) & set(base))
        gains = [mine[k]["whole_run_throughput_tok_s"] / base[k]["whole_run_throughput_tok_s"]
                 - 1 for k in keys]
        ttft = [mine[k]["ttft_p95_ms"] / base[k]["ttft_p95_ms"] - 1 for k in keys]
        p99 = [mine[k]["fcfs_rule_excess_s_p99"] for k in keys]
        out[lab] = {
            "policy_options": mine[keys[0]]["policy_options"],
            "whole_run_gain": _stat(gains), "ttft_p95_vs_jsq": _stat(ttft),
            "fcfs_rule_excess_s_p99": {**_stat(p99), "worst_window": max(p99)},
            "fcfs_rule_excess_s_max": max(mine[k]["fcfs_rule_excess_s_max"] for k in keys),
            "fcfs_replay_delay_s_p99": sum(mine[k]["fcfs_replay_delay_s_p99"]
                                           for k in keys) / len(keys)}
        if other is not None and lab != against:  # the paired whole-run gain over it
            ks = sorted(set(mine) & set(other))
            out[lab][f"whole_run_gain_vs_{against}"] = _stat(
                [mine[k]["whole_run_throughput_tok_s"] / other[k]["whole_run_throughput_tok_s"]
                 - 1 for k in ks])
        for part in ("fill", "rest"):  # research/policy/fill_split.py's runs only
            if all(f"{part}_rule_excess_s_p99" in mine[k] for k in keys):
                xs = [mine[k][f"{part}_rule_excess_s_p99"] for k in keys]
                out[lab][f"{part}_rule_excess_s_p99"] = {**_stat(xs), "worst_window": max(xs)}
                out[lab][f"{part}_rule_excess_s_max"] = max(
                    mine[k][f"{part}_rule_excess_s_max"] for k in keys)
                out[lab][f"{part}_over_30s_per_window"] = sum(
                    mine[k][f"{part}_over_30s"] for k in keys) / len(keys)
        got = [mine[k].get("pace_rule_excess_s_p99") for k in keys]
        pace = [float(x) for x in got if x is not None]
        if len(pace) == len(got):  # runs made before the metric lack it
            out[lab]["pace_rule_excess_s_p99"] = {**_stat(pace), "worst_window": max(pace)}
            out[lab]["pace_rule_excess_s_max"] = max(mine[k]["pace_rule_excess_s_max"]
                                                     for k in keys)
    off = out.get("off", {}).get("whole_run_gain", {}).get("mean")
    for row in out.values():
        row["ratio_to_off"] = row["whole_run_gain"]["mean"] / off if off else None
    return out


def _ci(s: dict[str, Any], scale: float = 100.0, fmt: str = "+.1f") -> str:
    lo, hi = s["ci95"] or (float("nan"), float("nan"))
    return f"{scale * s['mean']:{fmt}} [{scale * lo:{fmt}}, {scale * hi:{fmt}}]"


def _pace(r: dict[str, Any]) -> str:
    x = r.get("pace_rule_excess_s_p99")
    return "-" if x is None else f"{x['mean']:.0f} / {r['pace_rule_excess_s_max']:.0f}"


def _split(r: dict[str, Any]) -> str:
    if "fill_rule_excess_s_p99" not in r:
        return ""
    f, t = r["fill_rule_excess_s_p99"], r["rest_rule_excess_s_p99"]
    return (f" fill {f['mean']:.0f} / {r['fill_rule_excess_s_max']:.0f}; rest "
            f"{t['mean']:.0f} ({t['worst_window']:.0f}) / {r['rest_rule_excess_s_max']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--labels", default=None)
    ap.add_argument("--against", default=None, help="also pair every label's whole-run "
                    "throughput against this label's (whole_run_gain_vs_<label>)")
    a = ap.parse_args()
    want = None if a.labels is None else a.labels.split(",")
    runs: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for d in a.dirs:  # cells of several runs merge (the same windows: jsq is identical)
        for f in sorted(Path(d).glob("*/summary.json")):
            into = runs.setdefault(f.parent.name, {})
            for r in json.loads(f.read_text())["runs"]:
                if want is None or r["label"] in want or r["label"] == "jsq":
                    into.setdefault((r["label"], r["replay"]), r)
    cells = {name: cell({"runs": list(rs.values())}, a.against)
             for name, rs in sorted(runs.items())}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"cells": cells}, indent=2))
    split = any("fill_rule_excess_s_p99" in r for c in cells.values() for r in c.values())
    print("| cell | variant | whole-run gain vs jsq % | ratio to off | TTFT P95 vs jsq % | "
          "TTFT - 2xFCFS P99 s (worst window) | max s | own-clock excess P99 s / max |"
          + (" start-up fill P99 / max; rest P99 (worst) / max s |" if split else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if split else ""))
    for name, c in cells.items():
        for lab, r in c.items():
            ratio = r["ratio_to_off"]
            x = r["fcfs_rule_excess_s_p99"]
            print(f"| {name} | {lab} | {_ci(r['whole_run_gain'])} | "
                  f"{'-' if ratio is None else f'{100 * ratio:.0f}%'} | "
                  f"{_ci(r['ttft_p95_vs_jsq'])} | {_ci(x, 1.0, '.0f')} "
                  f"({x['worst_window']:.0f}) | {r['fcfs_rule_excess_s_max']:.0f} | "
                  f"{_pace(r)} |{_split(r)}")


if __name__ == "__main__":
    main()
