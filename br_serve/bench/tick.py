"""``br-serve bench-tick``: latency of one scheduling tick on realistic random states.

A state is a steady-state decode cluster: ``G`` replicas with ``slots`` each, every
slot busy except ``1 + Poisson(free_slots - 1)`` free ones spread over random
replicas (default mean ``G/4``), running requests with lognormal prompts (median
~1,800 tokens) and up to 2,000 decoded tokens, and a pool of ``N`` prefilled requests
with the same prompt distribution.

Why ``G/4``: the scheduler ticks every decode step, and in a step about
``G*B/mean_output`` requests finish (0.26 for G=16, B=16 and 1,000-token outputs), so
a real tick usually sees zero or one free slot; ``G/4`` is pessimistic on purpose.
``--free-slots G`` (or more) measures a burst, e.g. after a stall. States are generated before
timing; each timed tick runs ``policy.schedule`` once (the predictor call included for
``brh``) on one of them, cycling. Numbers are wall-clock microseconds of this process.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from br_serve.core import (
    ClusterSnapshot,
    PolicyContext,
    PoolRequest,
    PromptPool,
    RunningRequests,
    TerminationPredictor,
    build_policy,
    predictor_horizon,
)
from br_serve.core.options import Options, as_dict


def make_state(rng: np.random.Generator, replicas: int, slots: int, pool: int,
               free_slots: float | None = None, prompt_median_tokens: float | None = None
               ) -> tuple[ClusterSnapshot, PromptPool]:
    """One realistic steady-state snapshot and pool (see the module docstring).

    ``prompt_median_tokens``: the lognormal prompts' median (None: ``e^7.5``; a
    reasoning-style trace such as ServeGen R1 has ~60, where the pool cannot refill
    the decoded tokens the window drops and BR-H's trust rule looks ahead).
    """
    mu = 7.5 if prompt_median_tokens is None else float(np.log(prompt_median_tokens))
    mean_free = replicas / 4 if free_slots is None else free_slots
    n_free = min(1 + int(rng.poisson(max(mean_free - 1.0, 0.0))), replicas * slots)
    free = np.zeros(replicas, dtype=np.int64)
    while n_free > 0:  # spread over random replicas, never past a replica's slots
        g = int(rng.integers(replicas))
        if free[g] < slots:
            free[g] += 1
            n_free -= 1
    running = slots - free
    rep = np.repeat(np.arange(replicas), running)
    n = rep.shape[0]
    prompt = rng.lognormal(mu, 1.2, n).astype(np.int64)
    decoded = rng.integers(0, 2000, n)
    rr = RunningRequests.build(rep, prompt, decoded, prefix_hash=rng.integers(0, 64, n))
    load = np.bincount(rep, weights=prompt + decoded, minlength=replicas).astype(np.int64)
    snap = ClusterSnapshot.build(load, running, slots, running=rr)
    p = PromptPool(capacity=max(pool, 1))
    sizes = rng.lognormal(mu, 1.2, pool).astype(np.int64)
    for i, s in enumerate(sizes.tolist()):
        p.add(PoolRequest(f"p{i}", s, enqueued_s=0.0, enqueued_tick=0))
    return snap, p


def run_bench(policy: str, replicas: int, pool: int, *,
              options: Mapping[str, Any] | Options | None = None,
              slots: int = 16, ticks: int = 1000, states: int = 64, seed: int = 0,
              free_slots: float | None = None,
              predictor: TerminationPredictor | None = None,
              predictor_name: str = "survives") -> dict[str, Any]:
    """Time ``ticks`` scheduling ticks and return the summary (microseconds).

    ``options`` are the policy's own options (validated by its options class).
    """
    if ticks < 1 or states < 1:
        raise ValueError("ticks: must be >= 1")
    rng = np.random.default_rng(seed)
    built = [make_state(rng, replicas, slots, pool, free_slots) for _ in range(states)]
    pol = build_policy(policy, options,
                       PolicyContext(rng=np.random.default_rng(seed), predictor=predictor))
    horizon = predictor_horizon(policy, pol.options)
    for i in range(min(50, ticks)):  # warm-up: caches, lazy imports
        snap, pl = built[i % states]
        pol.schedule(snap, pl, 0.0, 0)
    lat = np.empty(ticks)
    assigned = 0
    clock = time.perf_counter_ns
    for i in range(ticks):
        snap, pl = built[i % states]
        t0 = clock()
        res = pol.schedule(snap, pl, 0.0, 0)
        lat[i] = clock() - t0
        assigned += len(res.assignments)
    us = lat / 1e3
    return {
        "policy": policy,
        "replicas": replicas,
        "pool": pool,
        "horizon": horizon,
        "predictor": predictor_name if horizon is not None else None,
        "options": {k: v for k, v in as_dict(pol.options).items()},
        "slots": slots,
        "free_slots_mean": replicas / 4 if free_slots is None else free_slots,
        "ticks": ticks,
        "p50_us": round(float(np.percentile(us, 50)), 2),
        "p99_us": round(float(np.percentile(us, 99)), 2),
        "mean_us": round(float(us.mean()), 2),
        "max_us": round(float(us.max()), 2),
        "mean_assigned_per_tick": round(assigned / ticks, 3),
        "mean_free_slots": round(float(np.mean([s.free_slots.sum() for s, _ in built])), 3),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _cmd(args: argparse.Namespace) -> int:
    from br_serve.config.plan import parse_key_values
    from br_serve.core import parse_policy_options

    options = parse_key_values(args.policy_option)
    if args.horizon is not None:
        options["horizon"] = str(args.horizon)
    opts = parse_policy_options(args.policy, options)
    horizon = predictor_horizon(args.policy, opts)
    pred = None
    if horizon is not None and args.predictor != "survives":
        from predictors import make_predictor, warm_start

        pred = make_predictor(args.predictor, horizon=horizon)
        if args.warm_start:
            # finished history like the states' requests (outputs past their decoded
            # counts), so the predictor projects in-window finishes as in a warm cluster
            rng = np.random.default_rng(args.seed + 1)
            warm_start(pred, rng.lognormal(7.5, 1.2, args.warm_start).astype(np.int64),
                       rng.integers(1, 2500, args.warm_start))
    res = run_bench(args.policy, args.replicas, args.pool, options=opts,
                    slots=args.slots, ticks=args.ticks, seed=args.seed, predictor=pred,
                    predictor_name=args.predictor, free_slots=args.free_slots)
    if args.json:
        print(json.dumps(res))
    else:
        print(" ".join(f"{k}={v}" for k, v in res.items()))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench-tick", help="measure scheduling-tick latency",
                       description=__doc__)
    p.add_argument("--replicas", "-G", type=int, default=16)
    p.add_argument("--pool", "-N", type=int, default=1024)
    p.add_argument("--policy", default="br0")
    p.add_argument("--horizon", type=int, default=None,
                   help="shorthand for --policy-option horizon=H")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the policy (repeatable), e.g. r_max=4")
    p.add_argument("--predictor", default="survives",
                   help="for a policy that uses one: survives (closed gate) or a "
                   "predictor name")
    p.add_argument("--warm-start", type=int, default=0, metavar="N",
                   help="feed the predictor N finished requests first (outputs 1-2,500 "
                   "tokens), so it projects finishes as in a warm cluster")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--free-slots", type=float, default=None,
                   help="mean free slots per tick (default G/4; >= G for a burst)")
    p.add_argument("--ticks", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd)
