"""``br-serve`` benchmark commands of the serving stack: ``bench-serve`` (the live graph
beside the simulator), ``bench-control-plane`` (the graph's own per-step cost) and
``bench-kv`` (KV transfer throughput per transport)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from br_serve.serve.cli import (
    common_arguments,
    kv_args,
    on_free_port,
    port_given,
    start_ray,
    stop_ray,
)
from br_serve.serve.config import field_path, from_stored, parse_graph_config


def cmd_bench(args: argparse.Namespace) -> int:
    from br_serve.bench.serve_bench import plan_runs, run_bench, slowed
    from br_serve.config.plan import parse_key_values

    if args.resimulate:
        return _resimulate(args)
    given = kv_args(args.set)
    for key in given:
        if field_path(key)[0] in ("policy", "predictor"):
            raise ValueError(f"--set {key}: give the runs with --policies (NAME, "
                             "LABEL=NAME, NAME:PREDICTOR) and their options with "
                             "--policy-option")
    opts = {"replicas": "8", "pool.capacity": "4096", **given}
    base = parse_graph_config(opts)
    for spec in args.slow:
        base = slowed(base, *_slow_spec(spec))
    if args.repeats < 1:
        raise ValueError(f"--repeats: must be at least 1 (got {args.repeats})")
    if args.sim_seeds < 0 or args.sim_jitter < 0:
        raise ValueError("--sim-seeds/--sim-jitter: must not be negative")
    if args.trace and not Path(args.trace).exists():
        raise FileNotFoundError(f"--trace: no such file {args.trace}")
    workload = {"trace": args.trace, "requests": args.requests,
                "arrival_scale": args.arrival_scale, "max_output": args.max_output,
                "max_prompt": args.max_prompt, "seed": base.seed}
    trace = _workload(workload)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    planned = plan_runs(base, policies, parse_key_values(args.policy_option))  # up front
    labels = [run.label for run, _ in planned]
    baseline = args.baseline or "jsq"
    if baseline not in labels:
        raise ValueError(f"--baseline: {baseline!r} is not one of the runs "
                         f"({', '.join(labels)})")
    start_ray(args.num_cpus, base.serve.front)
    if not port_given(given):
        base = on_free_port(base)  # after Ray's own processes took their ports
        planned = plan_runs(base, policies, parse_key_values(args.policy_option))
    try:
        res = run_bench(base, planned, trace, Path(args.out), args.timeout,
                        repeats=args.repeats, jitter_s=args.sim_jitter, seeds=args.sim_seeds,
                        workload=workload, overhead_from=args.overhead_from,
                        baseline=baseline, engine=args.engine)
    finally:
        stop_ray()
    lost = sum(r["measured"]["requests_lost"] + r["measured"]["bad_tokens"]
               for r in res["runs"])
    print(f"wrote {args.out}")
    return 0 if lost == 0 else 1


def _slow_spec(text: str) -> tuple[list[int], float]:
    """``"4,5,6,7:1.5"`` or ``"4-7:1.5"`` -> ``([4, 5, 6, 7], 1.5)``."""
    reps, _, fac = text.partition(":")
    try:
        out: list[int] = []
        for part in reps.split(","):
            lo, dash, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
        return out, float(fac)
    except ValueError:
        raise ValueError(f"--slow: expected REPLICAS:FACTOR, e.g. 4-7:1.5 (got {text!r})"
                         ) from None


def _workload(w: dict[str, Any]) -> Any:
    from br_serve.bench.serve_bench import load_workload

    return load_workload(w["trace"], w["requests"], w["arrival_scale"], w["max_output"],
                         w["max_prompt"], w["seed"])


def _resimulate(args: argparse.Namespace) -> int:
    """Recompute the simulator's side of an earlier run's JSON (no Ray, no HTTP)."""
    from br_serve.bench.serve_bench import report

    path = Path(args.resimulate)
    if not path.exists():
        raise FileNotFoundError(f"--resimulate: no such file {path}")
    old = json.loads(path.read_text())
    if not old.get("workload") or "runs" not in old:
        raise ValueError(f"--resimulate: {path} has no workload or runs (not a "
                         "bench-serve result of this version)")
    base = from_stored(old["config"])
    keep = ("config", "workload", "requests", "repeats", "baseline", "runs")
    res = {k: old[k] for k in keep if k in old}
    res["sim_jitter_s"], res["sim_seeds"] = args.sim_jitter, args.sim_seeds
    if args.baseline:
        res["baseline"] = args.baseline
    report(res, _workload(old["workload"]), base, Path(args.out), args.overhead_from)
    print(f"wrote {args.out}")
    return 0


def register(sub: Any) -> None:
    common = common_arguments()
    p = sub.add_parser("bench-serve", parents=[common],
                       help="replay a trace over HTTP per policy, beside the simulator")
    p.add_argument("--trace", default=None, help="trace file (default: synthetic)")
    p.add_argument("--requests", type=int, default=200, help="first N requests")
    p.add_argument("--arrival-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the rate)")
    p.add_argument("--max-output", type=int, default=256, help="clip outputs (tokens)")
    p.add_argument("--max-prompt", type=int, default=32768, help="clip prompts (tokens)")
    p.add_argument("--policies", default="jsq,br0,brh",
                   help="comma-separated runs: NAME, NAME:PREDICTOR, or LABEL=NAME (a "
                        "named variant with its own options, e.g. br0-time=br0)")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a policy option: KEY for every run whose policy has it, "
                        "ENTRY.KEY for one entry (policy name or variant label), "
                        "e.g. br0-time.cost=time; repeatable")
    p.add_argument("--baseline", default=None,
                   help="run label the gains are paired against (and whose runs "
                        "calibrate the simulator's host overhead); default jsq, or with "
                        "--resimulate the result's own")
    p.add_argument("--slow", action="append", default=[], metavar="REPLICAS:FACTOR",
                   help="multiply the step coefficients a, b, c of these replicas "
                        "(e.g. 4-7:1.5: half of G=8 1.5x slower); repeatable")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    p.add_argument("--engine", choices=("emulated", "vllm", "sglang"), default="emulated",
                   help="emulated: the built-in engine; vllm / sglang: the graph routes "
                        "`emulate-engine` servers of that protocol (same step model, "
                        "one prefill server, one decode server of G ranks)")
    p.add_argument("--repeats", type=int, default=1,
                   help="live runs per policy, interleaved (gains: mean and s.e.)")
    p.add_argument("--sim-jitter", type=float, default=0.05,
                   help="simulator ensemble: arrival jitter s.d. in seconds")
    p.add_argument("--sim-seeds", type=int, default=16,
                   help="simulator ensemble: jittered replays per policy")
    p.add_argument("--overhead-from", choices=("baseline", "own", "jsq"), default="baseline",
                   help="calibrate the simulator's host overhead per step on the baseline's "
                        "runs (default; others out of sample; 'jsq' is its older name) or "
                        "on each policy's own runs")
    p.add_argument("--resimulate", default=None, metavar="RESULT_JSON",
                   help="only redo the simulator side of an earlier result (to --out)")
    p.add_argument("--out", default="results/serve/serve_bench.json")
    p.set_defaults(func=cmd_bench)
    _register_kv(sub)
    from br_serve.bench import control_plane, peers_cli

    control_plane.register(sub)
    peers_cli.register(sub)


def _register_kv(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench-kv", help="measure KV transfer MB/s between two Ray actors per transport",
        description=__doc__)
    p.add_argument("--transports", default="objref,mooncake",
                   help="comma-separated: objref, mooncake (default both)")
    p.add_argument("--sizes-mib", default="1,16,64", help="payload sizes in MiB")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size")
    p.add_argument("--mooncake-master", default=None,
                   help="host:port of a running mooncake_master (default: start one)")
    p.add_argument("--ray-address", default=None,
                   help="join a running cluster (e.g. auto); default: start a local Ray")
    p.add_argument("--out", default="kv_transfer.json", help="JSON report path")
    p.set_defaults(func=_bench_kv)


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise ValueError(f"--sizes-mib: not a list of integers: {text!r}") from exc
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes-mib: need sizes >= 1, got {text!r}")
    return sizes


def _bench_kv(args: argparse.Namespace) -> int:
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in ("objref", "mooncake")]
    if bad or not transports:
        raise ValueError(f"--transports: unknown {bad or transports}; known: objref, mooncake")
    if args.reps < 1:
        raise ValueError("--reps: must be >= 1")
    sizes = _parse_sizes(args.sizes_mib)
    from br_serve.bench.kv import format_rows, run_bench

    report = run_bench(transports, sizes, args.reps, args.mooncake_master, args.ray_address)
    print(json.dumps(report["config"]))
    print(format_rows(report["results"]))
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0
