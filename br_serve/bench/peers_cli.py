"""``br-serve bench-peers``: the graph against sglang-router / smg and vllm-router.

Example (G = 4, four windows of 192 ServeGen R1 requests, saturated, both protocols,
the simulator beside it)::

    br-serve bench-peers --trace ../shared/traces/servegen/deepseek_r1_5rps_1h.csv \\
        --windows 4 --window 192 --max-output 256 --set replicas=4 --sim \\
        --out results/peers/servegen_g4.json

Needs the ``[peers]`` extra (``pip install 'br-serve[peers]'``). Writes the JSON, a
markdown table (``.md``) and a plot (``.png``) next to it. See docs/peers.md.
"""

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

PROTOCOLS = ("sglang", "vllm")


def _arms(args: argparse.Namespace, policy: str) -> list[tuple[str, Any]]:
    from br_serve.bench.peers_routers import ARMS, Arm, router_available

    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad or not protocols:
        raise ValueError(f"--protocols: unknown {bad or protocols}; known: sglang, vllm")
    wanted = ([a.strip() for a in args.arms.split(",") if a.strip()] if args.arms
              else [k for k, a in ARMS.items() if a.protocol in protocols])
    unknown = [a for a in wanted if a not in ARMS]
    if unknown:
        raise ValueError(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
    out: list[tuple[str, Any]] = []
    for protocol in protocols:
        out.append((protocol, Arm(f"graph:{policy}", "graph", policy, (), policy)))
        for label in wanted:
            arm = ARMS[label]
            if arm.protocol != protocol:
                continue
            why = router_available(arm.router)
            if why is not None:
                raise ValueError(f"--arms: {label}: {why}")
            out.append((protocol, arm))
    return out


def _measured(path: str, config: dict[str, Any]
              ) -> tuple[list[dict[str, Any]], Any, dict[str, Any]]:
    """The live runs and capacity of an earlier result ``path`` (``--resim``), checked
    to be on the windows this invocation makes; its config, with the new graph's."""
    old = json.loads(Path(path).read_text())
    if old["config"]["window_starts"] != config["window_starts"]:
        raise ValueError(f"--resim: {path} was measured on windows starting at "
                         f"{old['config']['window_starts']}, these options make "
                         f"{config['window_starts']}: give the same --trace, --windows, "
                         "--window and --seed")
    for k in ("trace", "windows", "window", "max_output", "max_prompt"):
        if old["config"][k] != config[k]:
            raise ValueError(f"--resim: {path} has {k}={old['config'][k]!r}, these options "
                             f"{config[k]!r}")
    return old["runs"], old.get("capacity"), {**old["config"], "sim_graph": config["graph"]}


def cmd_bench_peers(args: argparse.Namespace) -> int:
    from br_serve.bench import peers, peers_capacity, peers_report
    from br_serve.serve.config import parse_graph_config

    if not Path(args.trace).exists():
        raise FileNotFoundError(f"--trace: no such file {args.trace}")
    if args.windows < 1 or args.window < 2:
        raise ValueError("--windows must be >= 1 and --window >= 2")
    given = kv_args(args.set)
    opts = {"replicas": "4", "pool_capacity": "4096", **given}
    base = parse_graph_config(opts)
    scales = tuple(float(x) for x in args.timed_scales.split(",") if x.strip())
    if any(s <= 0 for s in scales):
        raise ValueError(f"--timed-scales: must be > 0 (got {args.timed_scales})")
    wins = peers.windows(args.trace, args.windows, args.window, args.max_prompt,
                         args.max_output, base.seed)
    arms = _arms(args, base.policy.name)
    slo = peers_capacity.default_slo(base, wins, args.slo_tpot_p95_ms, args.slo_ttft_p95_s)
    if args.capacity and not 0 < args.capacity_lo < args.capacity_hi:
        raise ValueError(f"--capacity-lo/--capacity-hi: need 0 < lo < hi (got "
                         f"{args.capacity_lo}, {args.capacity_hi})")
    if args.capacity and args.capacity_tol <= 0:
        raise ValueError(f"--capacity-tol: must be > 0 (got {args.capacity_tol})")
    if args.resim and args.keep_router_runs:
        raise ValueError("--resim and --keep-router-runs: give one")
    if args.sim_seeds < 1:
        raise ValueError(f"--sim-seeds: must be >= 1 (got {args.sim_seeds})")
    live = [(p, a) for p, a in arms if a.router == "graph" or not args.keep_router_runs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {"trace": args.trace, "windows": args.windows, "window": args.window,
              "max_output": args.max_output, "max_prompt": args.max_prompt,
              "graph": base.model_dump(exclude={"api_key"}),
              "arms": [[p, a.label, list(a.flags)] for p, a in arms],
              "window_starts": [w.start for w in wins]}
    kept: list[dict[str, Any]] = []
    if args.keep_router_runs:
        old_rows, _, _ = _measured(args.keep_router_runs, config)
        kept = [r for r in old_rows if r["router"] != "graph"]
        config["router_runs_from"] = args.keep_router_runs
    if args.resim:
        rows, cap, config = _measured(args.resim, config)
    else:
        start_ray(args.num_cpus, base.serve.front)
        if not port_given(given):
            base = on_free_port(base)  # after Ray's own processes took their ports
            config["graph"] = base.model_dump(exclude={"api_key"})
        plan = peers.Plan(base, tuple(live), tuple(wins), not args.no_saturated, scales,
                          args.timeout)
        try:
            rows = peers.run_plan(plan) + kept
            cap = None
            if args.capacity:
                cap = peers_capacity.capacity_per_window(
                    plan, slo, args.capacity_lo, args.capacity_hi, args.capacity_tol)
        finally:
            stop_ray()
    result: dict[str, Any] = {"config": config, "runs": rows,
                              "summary": peers_report.summarise(rows), "capacity": cap}
    if cap is not None:
        result["slo"] = {"tpot_p95_ms": slo.tpot_p95_ms, "ttft_p95_s": slo.ttft_p95_s,
                         "rule": "given" if args.slo_tpot_p95_ms is not None else
                         f"TPOT P95 <= {peers_capacity.TPOT_STEP_FACTOR} x a full balanced "
                         "replica's step (b + a * slots * (mean prompt + mean output / 2))",
                         "bracket": [args.capacity_lo, args.capacity_hi],
                         "rel_tol": args.capacity_tol}
    if args.sim:
        sims = {}
        for saturated in (True, False) if scales else (True,):
            mode = "saturated" if saturated else "timed"
            # the graph is simulated with the engine queue it runs live (remote
            # engines: pool.dispatch_ahead, 2 unless given); a router binds at arrival
            ahead = base.dispatch_ahead(remote=True)
            pols = {a.label: peers_report.SimArm(
                        a.sim_policy, dict(a.sim_options),
                        engine_queue=ahead if a.router == "graph" else 0)
                    for _, a in arms if a.sim_policy}
            sims[mode] = peers_report.simulate_windows(
                base, wins, pols, saturated, seeds=args.sim_seeds,
                tick_per_delivery=args.sim_ticks == "delivery")
        result["sim"] = sims
        result["sim_ticks"] = args.sim_ticks
        rr = {p: a.label for p, a in arms if a.rule == "round_robin" and a.router != "graph"}
        result["agreement"] = peers_report.agreement(result["summary"], sims["saturated"],
                                                     rr)
    out.write_text(json.dumps(result, indent=2))
    md = peers_report.markdown(result)
    out.with_suffix(".md").write_text(md)
    peers_report.plot(result, str(out.with_suffix(".png")))
    print(md)
    print(f"wrote {out} (+ .md, .png)")
    lost = sum(int(r["measured"].get("requests_lost", 0)) + ("failed" in r["measured"])
               for r in rows)
    return 0 if lost == 0 else 1


def register(sub: Any) -> None:
    p = sub.add_parser("bench-peers", parents=[common_arguments()],
                       help="the graph against the real peer routers, same emulated engines",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, help="trace file (see br_serve.traces)")
    p.add_argument("--windows", type=int, default=4, help="K paired windows")
    p.add_argument("--window", type=int, default=192, help="requests per window")
    p.add_argument("--max-output", type=int, default=256, help="clip outputs (tokens)")
    p.add_argument("--max-prompt", type=int, default=32768, help="clip prompts (tokens)")
    p.add_argument("--protocols", default="sglang,vllm",
                   help="engine protocols: sglang (smg's arms), vllm (vllm-router's)")
    p.add_argument("--arms", default=None,
                   help="router arms, e.g. smg:power_of_two,vllm-router:round_robin "
                        "(default: every arm of the protocols); the graph always runs")
    p.add_argument("--no-saturated", action="store_true", help="skip the saturated replays")
    p.add_argument("--timed-scales", default="",
                   help="comma list of arrival-rate multipliers for timed replays")
    p.add_argument("--capacity", action="store_true",
                   help="bisect each arm's capacity at the SLO on each window alone "
                        "(timed replays), paired by window")
    p.add_argument("--slo-tpot-p95-ms", type=float, default=None,
                   help="TPOT P95 bound (default: 1.25 x the step of a full, balanced "
                        "replica of the windows' mean-size requests)")
    p.add_argument("--slo-ttft-p95-s", type=float, default=10.0)
    p.add_argument("--capacity-lo", type=float, default=0.25,
                   help="lowest multiplier of a window's own arrival rate")
    p.add_argument("--capacity-hi", type=float, default=4.0,
                   help="highest multiplier of a window's own arrival rate")
    p.add_argument("--capacity-tol", type=float, default=0.05,
                   help="stop when hi / lo - 1 is below this")
    p.add_argument("--sim", action="store_true",
                   help="simulate each arm's model policy on the same windows")
    p.add_argument("--sim-seeds", type=int, default=8,
                   help="with --sim: seeds per window; each simulated metric is the mean "
                        "over them (a random rule's prediction is its mean over draws)")
    p.add_argument("--sim-ticks", choices=("delivery", "step"), default="delivery",
                   help="with --sim: the model's policy ticks once per request landing in "
                        "the pool, as the live scheduler and routers do (delivery), or once "
                        "per decode step over all that landed (step: the model of every "
                        "result made before this option; docs/simulator.md)")
    p.add_argument("--resim", default=None, metavar="RESULT_JSON",
                   help="no live runs: take RESULT_JSON's runs (made with the same "
                        "--trace/--windows/--window/--max-*) and redo the summary, the "
                        "simulator (with --sim) and the agreement; writes --out")
    p.add_argument("--keep-router-runs", default=None, metavar="RESULT_JSON",
                   help="run only the graph live; every real router's runs come from "
                        "RESULT_JSON (same --trace/--windows/--window/--max-*: checked), "
                        "paired with the new graph runs by window")
    p.add_argument("--timeout", type=float, default=900.0, help="per-request timeout (s)")
    p.add_argument("--out", default="results/peers/bench_peers.json")
    p.set_defaults(func=cmd_bench_peers)
