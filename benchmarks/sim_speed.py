"""Simulator speed: N requests at G replicas with one policy; prints and writes JSON.

Usage: python benchmarks/sim_speed.py [--requests 100000] [--replicas 16] [--slots 16]
       [--policy br0] [--saturated] [--out benchmarks/out/sim_speed.json]

The workload is synthetic and seeded (lognormal prompts, median 1024, and outputs,
median 512; Poisson arrivals at --load of a mean-load capacity estimate, about 90%
of what br0 sustains, unless --saturated), so the
number is reproducible anywhere. Wall time covers simulate() only, not trace generation.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from br_serve.sim import parse_sim_config, simulate
from br_serve.traces import SyntheticSpec, synthetic_trace
from br_serve.traces.synthetic import LengthDist


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--policy", default="br0")
    ap.add_argument("--predictor", default=None)
    ap.add_argument("--saturated", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, default=0.65,
                    help="arrival rate as a share of the mean-load capacity estimate "
                         "(the barrier makes the real capacity ~15%% lower)")
    ap.add_argument("--out", default="benchmarks/out/sim_speed.json")
    args = ap.parse_args()

    out_len = LengthDist(median=512, sigma=1.0, min_tokens=1, max_tokens=16384)
    in_len = LengthDist(median=1024, sigma=1.0, min_tokens=1, max_tokens=65536)
    # Decode capacity ~ G*B / (mean output * step time); step ~ a*B*(s+o/2) + b.
    mean_out = 512 * 1.6487  # lognormal mean = median * exp(sigma^2 / 2)
    step_s = 5e-7 * args.slots * (1024 * 1.6487 + mean_out / 2) + 0.03
    rate = args.load * args.replicas * args.slots / (mean_out * step_s)
    spec = SyntheticSpec(requests=args.requests, input=in_len, output=out_len,
                         arrival="saturated" if args.saturated else "poisson",
                         rate_per_s=rate, seed=args.seed)
    trace = synthetic_trace(spec)
    cfg = parse_sim_config(policy=args.policy, predictor=args.predictor, replicas=args.replicas,
                    slots=args.slots, sim_saturated=args.saturated, seed=args.seed)
    t0 = time.perf_counter()
    res = simulate(trace, cfg)
    wall = time.perf_counter() - t0
    s = res.summary()
    row = {
        "config": cfg.model_dump(), "workload": spec.model_dump(),
        "machine": {"python": platform.python_version(), "cpu": platform.processor(),
                    "node": platform.node()},
        "wall_s": wall, "steps": s["steps"], "steps_per_s": s["steps"] / wall,
        "requests_per_s": args.requests / wall, "ticks": s["ticks"],
        "tick_p50_us": s["tick_p50_us"], "tick_p99_us": s["tick_p99_us"],
        "requests_finished": s["requests_finished"],
        "mean_imbalance_tokens": s["mean_imbalance_tokens"],
        "throughput_tok_s": s["throughput_tok_s"],
        "pool_max": int(res.steps.pool.max()) if len(res.steps) else 0,
    }
    print(f"sim speed: {args.requests} requests, G={args.replicas}, B={args.slots}, "
          f"policy={cfg.label}, mode={'saturated' if args.saturated else 'poisson'} "
          f"(rate {rate:.1f}/s)")
    print(f"  wall {wall:.2f} s | {s['steps']} steps ({row['steps_per_s']:.0f} steps/s) | "
          f"{s['ticks']} ticks (p50 {s['tick_p50_us']:.0f} us, p99 {s['tick_p99_us']:.0f} us)"
          f" | finished {s['requests_finished']} | pool max {row['pool_max']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=2))
    print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
