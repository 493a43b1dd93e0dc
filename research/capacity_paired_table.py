"""Research: issue 27's capacity table from per-window searches (``capacity --per-replay``).

For each cell (a ``capacity.json`` written with ``--per-replay``): the default's mean
capacity with its 95% interval; the field rule with the highest mean capacity and the
default's paired per-window ratio over it; the paired ratio over the **best field rule
of each window** (the window's maximum over every field rule: stricter, it picks the
field's luckiest rule per window); the clairvoyant yardstick's ratio over the default;
TTFT P95 and TPOT P95 at each window's capacity (means).

    python research/capacity_paired_table.py OUT.json CELL=PATH/capacity.json ...

Writes OUT.json (rows) and OUT.md (the Markdown table, which
``benchmarks/capacity_section.py`` puts into docs/results.md), and prints the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from br_serve.sim.stats import paired

FIELD = ("jsq", "sglang_total_tokens", "min_max", "vllm_dp", "smg_min_tokens",
         "smg_least_load", "vllm_router_p2c", "stt-dyntralb")
ENGINE_SIDE = ("stt-dyntralb",)  # DyntraLB on the ranks: not a routing rule
DEFAULT = "br0"
YARDSTICK = "brh+oracle"


def _caps(run: dict[str, Any]) -> list[float]:
    return [float(w["capacity_req_s"]) for w in run["per_replay"]]


def _ratio(a: list[float], b: list[float]) -> dict[str, Any]:
    xs = [x / y - 1.0 for x, y in zip(a, b, strict=True) if y > 0]
    p = paired(xs)
    return {"mean": p.mean, "ci95": p.ci95, "n": p.n}


def cell_row(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    runs = {r["label"]: r for r in doc["runs"]}
    field = {k: runs[k] for k in FIELD if k in runs}
    best = max(field, key=lambda k: runs[k]["capacity_req_s"])
    d = runs[DEFAULT]
    per_best = [max(ws) for ws in zip(*(_caps(r) for r in field.values()), strict=True)]
    routers = [k for k in field if k not in ENGINE_SIDE]
    best_router = max(routers, key=lambda k: runs[k]["capacity_req_s"])
    row = {"cell": name, "replays": doc["replays"], "slo": doc["slo"],
           "default_req_s": d["capacity_req_s"], "default_ci95": d["capacity_ci95"],
           "default_ttft_p95_s": d["ttft_p95_s"], "default_tpot_p95_ms": d["tpot_p95_ms"],
           "default_idle": d.get("barrier_idle_share"),
           "best_field": best, "best_field_req_s": runs[best]["capacity_req_s"],
           "best_field_ttft_p95_s": runs[best]["ttft_p95_s"],
           "vs_best_field": _ratio(_caps(d), _caps(runs[best])),
           "vs_best_field_per_window": _ratio(_caps(d), per_best),
           "best_router": best_router, "best_router_req_s": runs[best_router]["capacity_req_s"],
           "vs_best_router": _ratio(_caps(d), _caps(runs[best_router])),
           "field": {k: {"req_s": r["capacity_req_s"], "ci95": r["capacity_ci95"]}
                     for k, r in field.items()},
           # a window capped at the bracket's top carries at least that: a censored value
           "capped_windows": {k: sum(bool(w["capped"]) for w in r["per_replay"])
                              for k, r in runs.items() if any(w["capped"]
                                                              for w in r["per_replay"])}}
    if YARDSTICK in runs:
        row["yardstick_req_s"] = runs[YARDSTICK]["capacity_req_s"]
        row["yardstick_vs_default"] = _ratio(_caps(runs[YARDSTICK]), _caps(d))
    return row


def _pct(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    ci = r["ci95"]
    return f"{100 * r['mean']:+.1f}%" + ("" if ci is None else
                                        f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]")


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| cell | K | default req/s [95%] | TTFT / TPOT P95 at it | best routing rule "
           "| default vs it | best field rule (DyntraLB counted) | default vs it | vs each "
           "window's best field rule | clairvoyant vs default |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = r["default_ci95"]
        out.append(
            f"| {r['cell']} | {r['replays']} | {r['default_req_s']:.3f} "
            f"[{ci[0]:.3f}, {ci[1]:.3f}] | {r['default_ttft_p95_s']:.1f} s / "
            f"{r['default_tpot_p95_ms']:.0f} ms | {r['best_router']} "
            f"{r['best_router_req_s']:.3f} | {_pct(r['vs_best_router'])} | {r['best_field']} "
            f"{r['best_field_req_s']:.3f} | {_pct(r['vs_best_field'])} | "
            f"{_pct(r['vs_best_field_per_window'])} | {_pct(r.get('yardstick_vs_default'))} |")
    notes = [f"- {r['cell']}: windows capped at the bracket's top (a censored capacity, at "
             f"least that): " + ", ".join(f"{k} {n}" for k, n in r["capped_windows"].items())
             for r in rows if r["capped_windows"]]
    return "\n".join(out) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def main(argv: list[str]) -> int:
    out, cells = Path(argv[0]), argv[1:]
    rows = []
    for c in cells:
        name, path = c.split("=", 1)
        rows.append(cell_row(name, json.loads(Path(path).read_text())))
    out.write_text(json.dumps({"rows": rows}, indent=1))
    out.with_suffix(".md").write_text(table(rows))  # docs/results.md takes it from there
    print(table(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
