"""Markdown tables of ``benchmarks/time_aware.py``'s JSON (for docs/time-aware-evaluation.md).

Usage::

    python benchmarks/time_aware_render.py [--ensemble results/time-aware/time_aware.json]
        [--capacity results/time-aware/time_aware_capacity.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

VARIANTS = ("br0-time", "br0-time-fixed", "br0-time-idle", "br0-time-fill")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def _ci(r: dict[str, Any] | None, key: str = "gain_vs_br0") -> str:
    if r is None or r.get(f"{key}_mean") is None:
        return "-"
    lo, hi = r[f"{key}_ci95"]
    return f"{_pct(r[f'{key}_mean'])} [{_pct(lo)}, {_pct(hi)}]"


def ensemble_table(doc: dict[str, Any]) -> list[str]:
    out = ["| workload | setting | mode | br0 vs jsq % | best of sglang, min_max vs jsq % | "
           + " | ".join(f"{v} vs br0 %" for v in VARIANTS)
           + " | share br0 / br0-time | stream speed-up br0-time vs br0 % | "
           "TTFT P95 s br0 / br0-time | from |",
           "|" + "---|" * (10 + len(VARIANTS) - 1)]
    for c in doc["cells"]:
        by = {r["label"]: r for r in c["rows"]}
        br0, t = by["br0"], by.get("br0-time")
        best = max((by[k]["gain_vs_jsq_mean"] for k in ("sglang_total_tokens", "min_max")
                    if k in by), default=None)
        trace = c["mode"] != "stationary"
        share = (f"{br0['headroom_share_mean']:.2f} / {t['headroom_share_mean']:.2f}"
                 if t else "-")
        ttft = (f"{br0['ttft_p95_ms_mean'] / 1e3:.2f} / {t['ttft_p95_ms_mean'] / 1e3:.2f}"
                if trace and t else "-")
        out.append(f"| {c['workload']} | {c['setting']} | {c['mode']} | "
                   f"{_pct(br0['gain_vs_jsq_mean'])} | {_pct(best)} | "
                   + " | ".join(_ci(by.get(v)) for v in VARIANTS)
                   + f" | {share} | {_ci(t, 'speedup_vs_br0') if trace else '-'} | {ttft} "
                   f"| {c.get('source', '-')} |")
    return out


def capacity_table(doc: dict[str, Any]) -> list[str]:
    labels = ("jsq", "sglang_total_tokens", "min_max", "br0", *VARIANTS)
    out = ["| workload | setting | SLO TPOT P95 ms | " + " | ".join(labels)
           + " | br0-time vs br0 | br0-time vs best baseline |",
           "|" + "---|" * (len(labels) + 5)]
    for c in doc["cells"]:
        by = {r["label"]: r["capacity_req_s"] for r in c["rows"]}
        base = max(by.get(k, 0.0) for k in ("jsq", "sglang_total_tokens", "min_max"))
        t, b = by.get("br0-time"), by.get("br0")
        vs_br0 = f"{100 * (t / b - 1):+.1f}%" if t and b else "-"
        vs_best = f"{100 * (t / base - 1):+.1f}%" if t and base else "-"
        cells = " | ".join("-" if by.get(k) is None else f"{by[k]:.3f}" for k in labels)
        out.append(f"| {c['workload']} | {c['setting']} | {c['slo']['tpot_p95_ms']} | "
                   f"{cells} | {vs_br0} | {vs_best} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ensemble", type=Path, nargs="+",
                    default=[Path("results/time-aware/time_aware.json")],
                    help="one or more JSON files; a later file's cell replaces an earlier "
                    "one of the same workload, setting and mode")
    ap.add_argument("--capacity", type=Path,
                    default=Path("results/time-aware/time_aware_capacity.json"))
    a = ap.parse_args()
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in a.ensemble:
        if path.exists():
            for c in json.loads(path.read_text())["cells"]:
                key = (c["workload"], c["setting"], c["mode"])
                cells[key] = {**c, "source": path.name}
    if cells:
        print("\n".join(ensemble_table({"cells": list(cells.values())})))
        print()
    if a.capacity.exists():
        print("\n".join(capacity_table(json.loads(a.capacity.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
