"""Tick latency with overdue requests: placed by fit (the default band) or oldest first.

The overdue band (``ageing_overdue_band``, docs/core.md, "Overdue by fit") looks for each
open replica's best overdue request by bisection, once per placement. Its cost grows with
the overdue requests read (at most ``OVERDUE_SCAN``) and the open replicas. This drives
``run_two_stage`` directly on seeded states of ``bench-tick`` (``make_state``: G replicas
of 16 slots, a pool of N), with 8 and 64 overdue requests (the oldest of the pool,
urgency 1) and 1, G and 16 G free slots spread over the replicas, the two orders
interleaved tick by
tick on the same states (alternating which goes first, after an untimed tick), and
prints (and writes with ``--json``) P50 / P90 per configuration.

    python -m benchmarks.tick_overdue [-G 16] [-N 1024] [--ticks 400] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from br_serve.bench.tick import make_state
from br_serve.core import ClusterSnapshot
from br_serve.core.policies.br0 import ScalarMargins
from br_serve.core.tick import run_two_stage


def _cluster(rng: np.random.Generator, g: int, free: int, base: ClusterSnapshot
             ) -> ClusterSnapshot:
    running = np.full(g, 16, dtype=np.int64)
    for i in rng.choice(g * 16, size=free, replace=False):
        running[i % g] -= 1 if running[i % g] > 0 else 0
    return ClusterSnapshot.build(base.load_tokens, running, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-G", type=int, default=16)
    ap.add_argument("-N", type=int, default=1024)
    ap.add_argument("--ticks", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    rows: list[dict[str, Any]] = []
    for free in (1, a.G, a.G * 16):
        for due in (8, 64):
            times: dict[str, list[float]] = {"oldest": [], "band": []}
            for _ in range(a.ticks):
                base, pool = make_state(rng, a.G, 16, a.N)
                cluster = _cluster(rng, a.G, free, base)
                starving = [(r, 1.0) for r in list(pool.fcfs())[:due]]
                # untimed first: the pool's sorted view is built on first use
                run_two_stage(cluster, pool, ScalarMargins(cluster), s_greedy=a.G, r_max=4)
                arms = [("oldest", None), ("band", 0.25)]
                for name, band in arms if len(times["band"]) % 2 else arms[::-1]:
                    t0 = time.perf_counter()
                    run_two_stage(cluster, pool, ScalarMargins(cluster), s_greedy=a.G,
                                  r_max=4, starving=starving, overdue_band=band)
                    times[name].append(time.perf_counter() - t0)
            row = {"replicas": a.G, "pool": a.N, "free_slots": free, "overdue": due}
            for name, ts in times.items():
                row[f"{name}_p50_us"] = 1e6 * float(np.percentile(ts, 50))
                row[f"{name}_p90_us"] = 1e6 * float(np.percentile(ts, 90))
            rows.append(row)
            print(f"G={a.G} N={a.N} free={free:4d} overdue={due:3d}: oldest first P50 "
                  f"{row['oldest_p50_us']:7.0f} us (P90 {row['oldest_p90_us']:7.0f}), by fit "
                  f"P50 {row['band_p50_us']:7.0f} us (P90 {row['band_p90_us']:7.0f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ticks": a.ticks, "seed": a.seed, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
