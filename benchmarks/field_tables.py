"""Markdown tables of ``benchmarks/field_first_look.sh``'s results (results/field/*.json),
as docs/core.md ("Which field rule is best where") shows them.

Usage: ``python benchmarks/field_tables.py [results/field]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

WORKLOADS = (("r1", "ServeGen R1, outputs > 1000"), ("mooncake", "Mooncake conversation"))
#: the field's rules, as named in issues 27 / 28 (the rest are this project's or peers')
FIELD = ("sglang_total_tokens", "min_max", "vllm_dp", "smg_min_tokens", "smg_least_load",
         "smg_power_of_two", "smg_cache_aware", "vllm_router_p2c", "consistent_hash",
         "jsq-dyntralb", "stt-dyntralb")


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def stationary_table(doc: dict[str, Any]) -> str:
    rows = ["| policy | tok/s | gain vs jsq (95% CI) | barrier idle | TPOT P95 ms | "
            "TTFT P95 s | waiting share | deferral flagged |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(doc["ensemble"], key=lambda r: -(r["throughput_tok_s_mean"] or 0)):
        ci = r.get("gain_vs_baseline_ci95")
        gain = ("baseline" if r["label"] == doc["baseline"] else
                f"{100 * r['gain_vs_baseline_mean']:+.1f}% [{100 * ci[0]:+.1f}, "
                f"{100 * ci[1]:+.1f}]" + (" tie" if r["gain_vs_baseline_tie"] else ""))
        ttft = r["ttft_p95_ms_mean"]
        rows.append(f"| {r['label']} | {_num(r['throughput_tok_s_mean'], ',.0f')} | {gain} | "
                    f"{_num(r['barrier_idle_share_mean'], '.1%')} | "
                    f"{_num(r['tpot_p95_ms_mean'], '.1f')} | "
                    f"{_num(None if ttft is None else ttft / 1e3, '.1f')} | "
                    f"{_num(r.get('dyntralb_waiting_share_mean'), '.1%')} | "
                    f"{_num(r.get('unrepresentative_share'), '.0%')} |")
    return "\n".join(rows)


def capacity_table(doc: dict[str, Any]) -> str:
    rows = ["| policy | capacity req/s | vs jsq | TPOT P95 ms | TTFT P95 s | "
            "barrier idle |", "|---|---|---|---|---|---|"]
    for r in sorted(doc["runs"], key=lambda r: -r["capacity_req_s"]):
        vs = r["capacity_vs_baseline"]
        rows.append(f"| {r['label']} | {r['capacity_req_s']:.3f} | "
                    f"{'-' if vs is None else f'{100 * vs:+.1f}%'} | "
                    f"{_num(r.get('tpot_p95_ms'), '.1f')} | {_num(r.get('ttft_p95_s'), '.1f')} | "
                    f"{_num(r.get('barrier_idle_share'), '.1%')} |")
    return "\n".join(rows)


def best_field(doc: dict[str, Any], key: str) -> str:
    rows = doc["ensemble"] if key == "throughput_tok_s_mean" else doc["runs"]
    mine = [r for r in rows if r["label"] in FIELD]
    top = max(mine, key=lambda r: r[key] or 0)
    return f"{top['label']} ({_num(top[key], ',.3f')})"


def main(folder: str = "results/field") -> int:
    base = Path(folder)
    for wl, title in WORKLOADS:
        for cell, render in (("stationary", stationary_table), ("capacity", capacity_table),
                             ("least-load-capacity", capacity_table)):
            p = base / f"{wl}-{cell}.json"
            if not p.exists():
                print(f"<!-- {p} missing -->\n")
                continue
            doc = json.loads(p.read_text())
            key = "throughput_tok_s_mean" if cell == "stationary" else "capacity_req_s"
            best = "" if cell.startswith("least") else f" (best field rule: {best_field(doc, key)})"
            print(f"**{title}, {cell}**{best}\n")
            print(render(doc) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
