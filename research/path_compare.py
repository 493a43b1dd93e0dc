"""Research: the graph's front path before/after, paired by window across bench runs.

Each input is a ``research/gap_bench.py`` result (same trace, windows and graph options)
of one version of the code, given as ``LABEL=PATH``, oldest first. Every
run's arm is tagged ``@LABEL`` (each version ran with its own smg ``round_robin`` arm in
the same windows, interleaved), and the paired gains (``peers_report.gain``: mean of
per-window ratios, 95% t-interval) are written for each graph arm against the router
of every session, and each later version's graph against every earlier version's.

    python research/path_compare.py main=/tmp/before.json path=/tmp/after.json \
        --out results/peers/path_g8.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.bench import peers_report

METRICS = (("output_tok_s",), ("tpot_p50_ms",), ("tpot_p95_ms",), ("ttft_p50_ms",),
           ("ttft_p95_ms",), ("engine", "tokens_per_busy_s"), ("engine_lag", "span_s"),
           ("cpu", "total_cpu_s"))


def combine(inputs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    labels: dict[str, list[str]] = {}
    for label, res in inputs:
        for r in res["runs"]:
            arm = f"{r['arm']}@{label}"
            rows.append({**r, "arm": arm, "version": label})
            labels.setdefault(label, [])
            if arm not in labels[label]:
                labels[label].append(arm)
    protocols = sorted({r["protocol"] for r in rows})
    gains = []

    def add(protocol: str, arm: str, ref: str) -> None:
        gains.append({"protocol": protocol, "arm": arm, "vs": ref, **{
            "/".join(p): peers_report.gain(rows, protocol, "saturated", 1.0, arm, ref, p)
            for p in METRICS}})

    order = [label for label, _ in inputs]
    for protocol in protocols:
        routers = [a for arms in labels.values() for a in arms if not a.startswith("graph")]
        for i, (label, arms) in enumerate(labels.items()):
            for arm in (a for a in arms if a.startswith("graph")):
                for router in routers:
                    add(protocol, arm, router)
                for earlier in order[:i]:  # against every earlier version's same arm
                    base = arm.replace(f"@{label}", f"@{earlier}")
                    if base in labels[earlier]:
                        add(protocol, arm, base)
    return {"inputs": {label: res["config"] for label, res in inputs}, "runs": rows,
            "summary": peers_report.summarise(rows), "gains": gains}


def _fmt(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    ci = [round(x * 100, 1) for x in v["ci95"]] if v["ci95"] else ""
    return f"{v['mean']:+.1%} {ci}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="LABEL=PATH of a gap_bench.py result")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    inputs = []
    for item in args.inputs:
        label, _, path = item.partition("=")
        inputs.append((label, json.loads(Path(path).read_text())))
    result = combine(inputs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    for g in result["gains"]:
        print(json.dumps({k: _fmt(v) for k, v in g.items() if v is not None}))
    print(f"wrote {args.out} ({len(result['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
