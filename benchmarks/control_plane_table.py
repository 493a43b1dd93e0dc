"""The control-plane table: ``br-serve bench-control-plane`` for several (G, streams),
this checkout beside an older one, interleaved (old, new, old, new, ...) so that slow
drifts of a shared host hit both alike.

    git worktree add --detach /tmp/old <commit-before>      # once
    python benchmarks/control_plane_table.py --old /tmp/old \\
        --out results/control-plane/control_plane.json

Each run is a fresh process (its own local Ray) that imports ``br_serve`` from the tree
it measures; the benchmark file itself (``br_serve/bench/control_plane.py``) only uses
what both versions have. Prints a markdown table and writes every run's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
BENCH = HERE / "br_serve" / "bench" / "control_plane.py"

DEFAULT_CASES = "4x4,4x64,8x8,8x128,16x16,16x256"


def run_one(tree: Path, replicas: int, streams: int, tokens: int, timeout_s: float,
            num_cpus: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "control_plane.py"  # alone: nothing beside it is importable
        shutil.copy(BENCH, script)
        env = {**os.environ, "PYTHONPATH": str(tree), "RAY_AUTH_MODE": "disabled"}
        cmd = [sys.executable, str(script), "--replicas", str(replicas), "--streams",
               str(streams), "--tokens", str(tokens), "--json"]
        if num_cpus:
            cmd += ["--num-cpus", str(num_cpus)]
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                 timeout=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": (out.stderr or out.stdout)[-800:]}
    return dict(json.loads(lines[-1]))


def _cell(r: dict[str, Any], key: str, fmt: str = "{}") -> str:
    return "failed" if "error" in r or r.get(key) is None else fmt.format(r[key])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", default=None, help="an older checkout to run beside this one")
    p.add_argument("--cases", default=DEFAULT_CASES, help="GxSTREAMS, comma-separated")
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--out", default="results/control-plane/control_plane.json")
    args = p.parse_args(argv)
    trees = [("old", Path(args.old))] if args.old else []
    trees.append(("new", HERE))
    runs: list[dict[str, Any]] = []
    for case in args.cases.split(","):
        g, n = (int(x) for x in case.lower().split("x"))
        for name, tree in trees:
            r = run_one(tree, g, n, args.tokens, args.timeout_s, args.num_cpus)
            r["code"], r["case"] = name, {"replicas": g, "streams": n}
            runs.append(r)
            print(json.dumps({"code": name, "G": g, "streams": n,
                              **{k: r.get(k) for k in ("steps_per_s", "ms_per_step",
                                                       "streamed_tok_s", "first_token_s",
                                                       "load_average", "error")}}),
                  flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"tokens": args.tokens, "runs": runs},
                                                 indent=1))
    print()
    print("| G | streams | code | steps/s | ms/step | streamed tok/s | first token s | "
          "CPU ms/step: decode, scheduler, ingress, proxy | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        c = r["case"]
        cpu = r.get("cpu_s_per_step") or {}
        parts = ", ".join(f"{cpu[k] * 1e3:.1f}" if cpu.get(k) is not None else "-"
                          for k in ("decode", "scheduler", "ingress", "proxy"))
        load = r.get("load_average", ["-"])[0]
        print(f"| {c['replicas']} | {c['streams']} | {r['code']} | "
              f"{_cell(r, 'steps_per_s')} | {_cell(r, 'ms_per_step')} | "
              f"{_cell(r, 'streamed_tok_s', '{:,.0f}')} | {_cell(r, 'first_token_s')} | "
              f"{parts} | {load} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
