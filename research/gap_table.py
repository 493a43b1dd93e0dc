"""Research: the markdown tables of a ``research/gap_bench.py`` result (docs/peers.md,
"The graph's slot turnover"); for runs with ``--engine-cpus`` / ``--router-cpus`` also
the emulator's lag behind its step model and the CPUs each side was allowed.

    python research/gap_table.py results/peers/gap_servegen_g4.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean
from typing import Any


def _m(runs: list[dict[str, Any]], *path: str) -> float | None:
    xs = []
    for r in runs:
        v: Any = r["measured"]
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if isinstance(v, list):
            v = mean(v)
        if isinstance(v, int | float):
            xs.append(float(v))
    return mean(xs) if xs else None


def _f(v: float | None, scale: float = 1.0, p: int = 1) -> str:
    return "-" if v is None else f"{v * scale:.{p}f}"


def _g(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    ci = g.get("ci95")
    return (f"{g['mean'] * 100:+.1f}%" + (f" [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]"
                                          if ci else "") + f" (n={g['n']})")


def main(path: str) -> None:
    res = json.loads(Path(path).read_text())
    runs = [r for r in res["runs"] if "failed" not in r["measured"]]
    gains = {(g["protocol"], g["arm"], g["vs"]): g for g in res["gains"]}
    for protocol in dict.fromkeys(r["protocol"] for r in runs):
        print(f"\n{protocol}: windows {sorted({r['window'] for r in runs})}\n")
        print("| arm | output tok/s | TPOT P50/P95 ms | TTFT P50/P95 s | engine running "
              "/ waiting per rank | engine imbalance tok | engine late s | host load |")
        print("|---|---|---|---|---|---|---|---|")
        arms = dict.fromkeys(r["arm"] for r in runs if r["protocol"] == protocol)
        for arm in arms:
            rs = [r for r in runs if r["protocol"] == protocol and r["arm"] == arm]
            print(f"| {arm} | {_f(_m(rs, 'output_tok_s'))} | "
                  f"{_f(_m(rs, 'tpot_p50_ms'))} / {_f(_m(rs, 'tpot_p95_ms'))} | "
                  f"{_f(_m(rs, 'ttft_p50_ms'), 1e-3, 2)} / {_f(_m(rs, 'ttft_p95_ms'), 1e-3, 2)} | "
                  f"{_f(_m(rs, 'engine', 'mean_running'), p=2)} / "
                  f"{_f(_m(rs, 'engine', 'mean_waiting'), p=2)} | "
                  f"{_f(_m(rs, 'engine', 'mean_imbalance_tokens'), p=0)} | "
                  f"{_f(_m(rs, 'engine', 'late_s'))} | {_f(_m(rs, 'host_load_1m'))} |")
        print("\n| arm | vs | output tok/s | TPOT P95 | TTFT P50 | TTFT P95 | engine tok "
              "per busy s | engine imbalance |")
        print("|---|---|---|---|---|---|---|---|")
        for (p, arm, vs), g in gains.items():
            if p == protocol:
                eng = [_paired(runs, protocol, arm, vs, "engine", k)
                       for k in ("tokens_per_busy_s", "mean_imbalance_tokens")]
                print(f"| {arm} | {vs} | {_g(g['output_tok_s'])} | {_g(g['tpot_p95_ms'])} | "
                      f"{_g(g['ttft_p50_ms'])} | {_g(g['ttft_p95_ms'])} | {_g(eng[0])} | "
                      f"{_g(eng[1])} |")
        if any("engine_lag" in r["measured"] for r in runs):
            lag_tables(runs, protocol, arms, gains)


def lag_tables(runs: list[dict[str, Any]], protocol: str, arms: Any,
               gains: dict[tuple[str, str, str], Any]) -> None:
    """The emulator's lag behind its step model per arm, the paired differences of the
    gains' pairs (seconds) and the CPUs each role was allowed (runs of
    ``gap_bench.py --engine-cpus/--router-cpus``)."""
    print("\n| arm | engine busy steps | span s | modelled s | lag s (late / idle) | "
          "CPUs allowed: emulators; router side |")
    print("|---|---|---|---|---|---|")
    for arm in arms:
        rs = [r for r in runs if r["protocol"] == protocol and r["arm"] == arm]
        emu: set[str] = set()
        rest: set[str] = set()
        for r in rs:
            for role, v in r["measured"].get("affinity", {}).get("roles", {}).items():
                if role != "?":  # a process without a command line: one exiting
                    (emu if role.startswith("emulator") else rest).update(v["cpus_allowed"])
        print(f"| {arm} | {_f(_m(rs, 'engine_lag', 'steps'), p=0)} | "
              f"{_f(_m(rs, 'engine_lag', 'span_s'), p=2)} | "
              f"{_f(_m(rs, 'engine_lag', 'modelled_s'), p=2)} | "
              f"{_f(_m(rs, 'engine_lag', 'lag_s'), p=2)} "
              f"({_f(_m(rs, 'engine_lag', 'late_s'), p=2)} / "
              f"{_f(_m(rs, 'engine_lag', 'idle_s'), p=2)}) | "
              f"{','.join(sorted(emu)) or '-'}; {','.join(sorted(rest)) or '-'} |")
    keys = ("span_s", "lag_s", "late_s", "idle_s")
    print("\n| arm | vs | paired differences, s: " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for p, arm, vs in gains:
        if p == protocol:
            d = [_diff(runs, protocol, arm, vs, "engine_lag", k) for k in keys]
            print(f"| {arm} | {vs} | " + " | ".join(_d(x) for x in d) + " |")


def _d(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    ci = g.get("ci95")
    return f"{g['mean']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "") + \
        f" (n={g['n']})"


def _diff(runs: list[dict[str, Any]], protocol: str, arm: str, ref: str, *path: str
          ) -> dict[str, Any] | None:
    """The paired absolute difference of ``path`` (arm - ref, per window)."""
    from br_serve.sim.stats import paired

    def by(label: str) -> dict[int, float]:
        return {r["window"]: v for r in runs if r["protocol"] == protocol
                and r["arm"] == label and (v := _m([r], *path)) is not None}

    a, b = by(arm), by(ref)
    xs = [a[w] - b[w] for w in sorted(a) if w in b]
    if not xs:
        return None
    p = paired(xs)
    return {"mean": p.mean, "ci95": p.ci95, "n": p.n}


def _paired(runs: list[dict[str, Any]], protocol: str, arm: str, ref: str, *path: str
            ) -> dict[str, Any] | None:
    """The paired relative difference of ``path`` (arm / ref - 1, per window)."""
    from br_serve.sim.stats import paired

    def by(label: str) -> dict[int, float]:
        out = {}
        for r in runs:
            if r["protocol"] == protocol and r["arm"] == label:
                v = _m([r], *path)
                if v is not None:
                    out[r["window"]] = v
        return out

    a, b = by(arm), by(ref)
    xs = [a[w] / b[w] - 1 for w in sorted(a) if b.get(w)]
    if not xs:
        return None
    p = paired(xs)
    return {"mean": p.mean, "ci95": p.ci95, "n": p.n}


if __name__ == "__main__":
    main(sys.argv[1])
