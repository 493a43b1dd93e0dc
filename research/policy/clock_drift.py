"""Does BalanceRoute's own release clock stand in for FCFS's? Per saturated window.

The fairness rule (docs/core.md, "Fairness") estimates each request's FCFS turn online
as the moment the pool had released as many requests as entered before it, on the
policy's *own* release clock. That clock is the FCFS clock only if the policy releases
requests as fast as FCFS would; a policy that admits long outputs first (it picks
prompts by size, and on some workloads size and output length go together) releases
fewer requests per second early and more late, and the estimate drifts.

This runs ``br-serve sim`` in-process (``--jobs 1``; every argument is passed through,
so name the baseline ``jsq`` and the policy under test ``br0``) and, per window, pairs
the two runs by their prompts and reports, at a few FCFS ranks, when each had
released that many requests (admitted: first token), the mean output and prompt length
of each quarter of the requests in the order each admitted them, and the P99 / max
of ``TTFT - 2 x TTFT`` against the jsq
replay (the harness's realised excess) and against br0's own release clock (what the
rule sees), and the five requests of highest excess. Writes JSON.

    python research/policy/clock_drift.py OUT.json sim --trace ... --sim-saturated \
        --limit 4000 --replays 8 --seed 1 --replicas 8 --jobs 1 --no-plots \
        --out /tmp/drift --policies jsq,br0
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

import br_serve.sim.runner as runner
from br_serve.cli import main as cli_main
from br_serve.sim.config import SimConfig
from br_serve.sim.engine import simulate
from br_serve.sim.result import SimResult
from br_serve.traces import Trace

RANK_SHARES = (0.125, 0.25, 0.375, 0.5, 0.75)
_plain_simulate = simulate
_runs: dict[str, list[dict[str, Any]]] = {}


def _simulate(trace: Trace, cfg: SimConfig, *, predictor: Any = None,
              progress: bool = False) -> SimResult:
    res = _plain_simulate(trace, cfg, predictor=predictor, progress=progress)
    first, _ = res.request_times()
    _runs.setdefault(cfg.policy.name, []).append({
        "ttft_s": np.asarray(first - res.arrival_s, dtype=np.float64),
        "output_tokens": np.asarray(res.output_tokens, dtype=np.float64),
        "prompt_tokens": np.asarray(res.prompt_tokens, dtype=np.float64),
        "key": hash(tuple(np.asarray(res.prompt_tokens).tolist())),
    })
    return res


def _window(base: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    tj, tb = base["ttft_s"], mine["ttft_s"]
    n = tb.size
    clock_j, clock_b = np.sort(tj), np.sort(tb)
    out, prompt = mine["output_tokens"], mine["prompt_tokens"]
    by_j, by_b = np.argsort(tj, kind="stable"), np.argsort(tb, kind="stable")
    realised = tb - 2.0 * tj
    own = tb - 2.0 * clock_b  # request i's FCFS turn on br0's clock: its i-th release
    return {
        "requests": int(n),
        "release_clock_s": [{"rank": int(s * n), "fcfs_jsq": float(clock_j[int(s * n)]),
                             "br0": float(clock_b[int(s * n)])} for s in RANK_SHARES],
        "mean_output_by_admitted_quarter": {
            "fcfs_jsq": [float(out[q].mean()) for q in np.array_split(by_j, 4)],
            "br0": [float(out[q].mean()) for q in np.array_split(by_b, 4)],
            "all": float(out.mean())},
        "mean_prompt_by_admitted_quarter": {
            "fcfs_jsq": [float(prompt[q].mean()) for q in np.array_split(by_j, 4)],
            "br0": [float(prompt[q].mean()) for q in np.array_split(by_b, 4)],
            "all": float(prompt.mean())},
        "excess_vs_fcfs_replay_s": {"p99": float(np.percentile(realised, 99)),
                                    "max": float(realised.max())},
        "excess_vs_own_clock_s": {"p99": float(np.percentile(own, 99)),
                                  "max": float(own.max())},
        "top_excess": [{"rank": int(i), "excess_s": float(realised[i]),
                        "ttft_br0_s": float(tb[i]), "ttft_fcfs_jsq_s": float(tj[i]),
                        "turn_own_clock_s": float(clock_b[i]),
                        "prompt_tokens": int(prompt[i]), "output_tokens": int(out[i])}
                       for i in np.argsort(-realised, kind="stable")[:5]],
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "sim":
        print(__doc__, file=sys.stderr)
        return 2
    setattr(runner, "simulate", _simulate)  # noqa: B010 (the runner imports it unexported)
    rc = cli_main(argv[1:])
    if rc not in (0, None):
        return int(rc)
    base = {r["key"]: r for r in _runs.get("jsq", [])}
    windows = [_window(base[r["key"]], r) for r in _runs.get("br0", []) if r["key"] in base]
    if not windows:
        print("clock_drift: no paired jsq / br0 windows (name them jsq and br0)",
              file=sys.stderr)
        return 2
    with open(argv[0], "w") as f:
        json.dump({"argv": argv[1:], "windows": windows}, f, indent=2)
        f.write("\n")
    for w in windows:
        c = w["release_clock_s"][2]
        m = w["mean_output_by_admitted_quarter"]
        q = "/".join(f"{x:.0f}" for x in m["br0"])
        print(f"rank {c['rank']}: jsq {c['fcfs_jsq']:.0f} s, br0 {c['br0']:.0f} s; "
              f"mean output by admitted quarter br0 {q}, jsq "
              f"{'/'.join(f'{x:.0f}' for x in m['fcfs_jsq'])}; excess P99 vs FCFS replay "
              f"{w['excess_vs_fcfs_replay_s']['p99']:.0f} s, vs own clock "
              f"{w['excess_vs_own_clock_s']['p99']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
