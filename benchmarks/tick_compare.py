"""Tick latency of several policy configurations side by side, interleaved tick by tick.

On a shared machine the load changes from second to second; running each configuration
for a whole block (as ``br-serve bench-tick`` does) lets the load decide the ranking.
Here every round runs one tick of every configuration on the same state, in a rotating
order, so all of them see the same load. States and predictor warm-up are those of
``br-serve bench-tick`` (``br_serve/bench/tick.py``; ``--warm-start`` finished requests
outputs of 1-2,080 tokens, so a survival predictor projects the running requests past
~1,920 decoded tokens to finish in an 80-step window, about 10 per tick at G=16, and
most of them in an 800-step one, which exercises the projection). The default states'
prompts (median 1,808) make most of the load, so BR-H's default decode rule makes
BR-0's decision there; ``--prompt-median 60`` gives decode-made states, where it looks
ahead.

Usage::

    python benchmarks/tick_compare.py [-G 16] [-N 1024] [--ticks 2000] [--json out.json]

Prints P50 / P99 microseconds per configuration and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from br_serve.bench.tick import make_state
from br_serve.core import PolicyContext, build_policy

CONFIGS: list[tuple[str, str, str | None, dict[str, Any]]] = [
    ("jsq", "jsq", None, {}),
    ("br0", "br0", None, {}),
    ("brh closed gate (default window)", "brh", None, {}),
    ("brh survival (defaults: H=800 ladder, decode rule)", "brh", "survival", {}),
    ("brh H=800 ladder survival, always look ahead", "brh", "survival",
     {"trust_decode_share": None}),
    ("brh H=80 ladder survival, always look ahead", "brh", "survival",
     {"horizon": 80, "horizon_step": 10, "trust_decode_share": None}),
    ("brh H=80 every step survival, always look ahead", "brh", "survival",
     {"horizon": 80, "horizon_step": None, "trust_decode_share": None}),
]


def add_state_args(p: argparse.ArgumentParser, ticks: int) -> None:
    """The options that describe the states and the run (shared with tick_ab.py)."""
    p.add_argument("-G", "--replicas", type=int, default=16)
    p.add_argument("-N", "--pool", type=int, default=1024)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--ticks", type=int, default=ticks)
    p.add_argument("--states", type=int, default=64)
    p.add_argument("--warm-start", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-median", type=float, default=None,
                   help="median prompt tokens of the states (default e^7.5 = 1,808; 60: "
                   "ServeGen R1-like, where the default trust rule looks ahead)")
    p.add_argument("--json", default=None)


def finish(a: argparse.Namespace, rows: list[dict[str, Any]], load0: Any, load1: Any
           ) -> None:
    """Print the run's configuration and load, and write the JSON (``--json``)."""
    print(f"G={a.replicas} pool={a.pool} slots={a.slots} ticks={a.ticks} "
          f"load average before {load0} after {load1}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"config": vars(a), "load_before": load0, "load_after": load1,
                       "rows": rows}, fh, indent=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_state_args(p, ticks=2000)
    a = p.parse_args()
    from br_serve.core.policy import parse_policy_options, predictor_horizon
    from predictors import make_predictor, warm_start

    rng = np.random.default_rng(a.seed)
    states = [make_state(rng, a.replicas, a.slots, a.pool,
                         prompt_median_tokens=a.prompt_median) for _ in range(a.states)]
    pols = []
    for label, name, pred_name, opts in CONFIGS:
        pred = None
        if pred_name is not None:
            horizon = predictor_horizon(name, parse_policy_options(name, opts))
            pred = make_predictor(pred_name, horizon=int(horizon or 0))
            wr = np.random.default_rng(a.seed + 1)
            warm_start(pred, wr.lognormal(7.5, 1.2, a.warm_start).astype(np.int64),
                       wr.integers(1, 2080, a.warm_start))
        pols.append((label, build_policy(name, opts, PolicyContext(predictor=pred))))
    for i in range(50):  # warm-up
        for _, pol in pols:
            s, pl = states[i % len(states)]
            pol.schedule(s, pl, 0.0, 0)
    lat = np.zeros((len(pols), a.ticks))
    look = np.zeros(len(pols))
    load0 = os.getloadavg()
    clock = time.perf_counter_ns
    for i in range(a.ticks):
        s, pl = states[i % len(states)]
        for j in range(len(pols)):
            k = (i + j) % len(pols)
            t0 = clock()
            res = pols[k][1].schedule(s, pl, 0.0, 0)
            lat[k, i] = clock() - t0
            look[k] += res.lookahead
    load1 = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for k, (label, _) in enumerate(pols):
        us = lat[k] / 1e3
        rows.append({"config": label, "p50_us": round(float(np.percentile(us, 50)), 1),
                     "p99_us": round(float(np.percentile(us, 99)), 1),
                     "lookahead_share": round(float(look[k] / a.ticks), 3)})
        r = rows[-1]
        print(f"{label:<44} P50 {r['p50_us']:8.1f} us  P99 {r['p99_us']:8.1f} us"
              f"  look-ahead used in {100 * float(r['lookahead_share']):.0f}% of ticks")
    finish(a, rows, load0, load1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
