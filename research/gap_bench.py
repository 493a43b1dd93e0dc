"""Research: the graph's slot turnover before/after dispatch ahead (issue 28), paired.

Per window (outermost) and protocol, every arm on fresh emulator pairs, interleaved:
the graph with ``pool.dispatch_ahead`` = 0 (binding only free slots: the old path) and
> 0, for each policy given, and the protocol's real ``round_robin`` router. Reports the
paired gains of every graph arm over the router and over the graph with depth 0, plus
the engine's mean running / waiting requests per rank (the turnover gap at the engine).

    nice -n 10 .venv/bin/python research/gap_bench.py \
        --trace ../shared/traces/servegen/deepseek_r1_5rps_1h.csv --windows 4 --window 48 \
        --out results/peers/gap_servegen_g4.json

CPU isolation (``--engine-cpus 1 --router-cpus 0``, :mod:`research.pinning`): the
emulators run on the engine CPUs, the bench, Ray with every process below it and the
real router on the router CPUs; arms are labelled ``@pinned``, and with ``--also-shared``
every arm runs a second time unpinned (``@shared``) in the same window, so the two are
paired. Each run records the affinity seen (``measured.affinity``), the emulator's lag
behind its modelled steps (``measured.engine_lag``) and ``uptime``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from br_serve.bench import peers, peers_report, serve_bench
from br_serve.bench.peers_routers import ARMS, Arm, running_router
from br_serve.bench.remote_engines import REMOTE_MODEL, engine_processes, engine_steps
from br_serve.bench.serve_bench import _measure_graph
from br_serve.serve.cli import free_port, start_ray, stop_ray
from br_serve.serve.config import parse_graph_config

# run as a script (``python research/gap_bench.py``, as the older manifest commands do),
# the script's folder is on the import path and the package is not
try:
    from research import pinning
except ModuleNotFoundError:
    import pinning  # type: ignore[no-redef]
try:
    from research.cpu_profile import CpuSampler
except ModuleNotFoundError:
    from cpu_profile import CpuSampler  # type: ignore[no-redef]

#: the CPU sampler of the arm running now: the replay marks its wall window on it
_CPU: list[CpuSampler] = []
_orig_replay = serve_bench._replay


async def _timed_replay(*a: Any, **k: Any) -> Any:
    t0 = time.monotonic()
    try:
        return await _orig_replay(*a, **k)
    finally:
        if _CPU:
            _CPU[-1].mark(t0, time.monotonic())


serve_bench._replay = _timed_replay

ROUTER = {"sglang": "smg:round_robin", "vllm": "vllm-router:round_robin"}
METRICS = (("output_tok_s",), ("tpot_p50_ms",), ("tpot_p95_ms",), ("ttft_p50_ms",),
           ("ttft_p95_ms",), ("engine", "mean_imbalance_tokens"),
           ("engine", "tokens_per_busy_s"))
LAG = (("engine_lag", "span_s"),)


def _minimal_agent() -> None:
    """Start Ray's dashboard agent in its minimal mode (as when the dashboard's
    dependencies are missing): it writes its port files at once, where the full agent
    takes longer than the raylet's fixed wait on a host at load 30-50 and the node never
    comes up. Research-script workaround; the product's start-up is unchanged."""
    import ray._private.utils as ray_utils

    ray_utils.get_dashboard_dependency_error = lambda: ImportError("minimal agent")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--only-window", type=int, default=None,
                    help="run window I of --windows only (a driver interleaving sessions "
                         "per window: research/front_compare.sh)")
    ap.add_argument("--window", type=int, default=48)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=16384)
    ap.add_argument("--protocols", default="sglang,vllm")
    ap.add_argument("--policies", default="br0,jsq")
    ap.add_argument("--depths", default="0,2", help="pool.dispatch_ahead values (br0)")
    ap.add_argument("--queued-loads", default="",
                    help="br0's policy.options.queued_load values, one arm each at every "
                         "depth > 0 (empty: the policy's default, one arm)")
    ap.add_argument("--option-arms", default="",
                    help="more arms of the first policy at the last depth, each with "
                         "policy options: NAME:key=value[+key=value],... (e.g. "
                         "hold0:hold_min_busy_share=0)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--engine-cpus", default="",
                    help="CPU list for the emulators (with --router-cpus; e.g. 1)")
    ap.add_argument("--router-cpus", default="",
                    help="CPU list for the bench, Ray and the routers (e.g. 0)")
    ap.add_argument("--also-shared", action="store_true",
                    help="with pinning: every arm also unpinned, in the same window")
    ap.add_argument("--out", default="results/peers/gap_servegen_g4.json")
    args = ap.parse_args()
    # the code that runs: HEAD at the start (a commit made while the bench runs is not it)
    args.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip()
    if bool(args.engine_cpus) != bool(args.router_cpus):
        ap.error("--engine-cpus and --router-cpus go together")
    if args.also_shared and not args.engine_cpus:
        ap.error("--also-shared needs --engine-cpus and --router-cpus")
    every_cpu = frozenset(os.sched_getaffinity(0))
    try:
        pins: list[tuple[str, Any]] = ([("", None)] if not args.engine_cpus else [
            ("@pinned", (pinning.parse_cpus(args.engine_cpus),
                         pinning.parse_cpus(args.router_cpus)))])
    except ValueError as exc:
        ap.error(f"--engine-cpus / --router-cpus: {exc}")
    if pins[0][1] is not None and pins[0][1][0] & pins[0][1][1]:
        ap.error("--engine-cpus and --router-cpus overlap")
    if args.also_shared:
        pins.append(("@shared", None))
    opts = {"replicas": "4", "slots": "8", "engine_slowdown": "2", "serve_port":
            str(free_port()), "pool_capacity": "4096"}
    for kv in args.set:
        k, v = kv.split("=", 1)
        opts[k.replace(".", "_")] = v
    base = parse_graph_config(opts)
    wins = peers.windows(args.trace, args.windows, args.window, args.max_prompt,
                         args.max_output, base.seed)
    if args.only_window is not None:
        wins = [w for w in wins if w.index == args.only_window]
    depths = [int(d) for d in args.depths.split(",")]
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    qls = [q.strip() for q in args.queued_loads.split(",") if q.strip()]
    plain: list[tuple[str, Arm, Any]] = []
    for protocol in [p.strip() for p in args.protocols.split(",") if p.strip()]:
        for pol in pols:
            for d in (depths if pol == pols[0] else depths[-1:]):
                if d and pol == "br0" and qls:  # one arm per queued_load (an option)
                    plain += [(protocol, Arm(f"graph:{pol}:d{d}:{q}", "graph", pol, (), pol,
                                             (("queued_load", q),)), d) for q in qls]
                else:
                    plain.append((protocol, Arm(f"graph:{pol}:d{d}", "graph", pol, (), pol),
                                  d))
        for spec in [o.strip() for o in args.option_arms.split(",") if o.strip()]:
            name, _, kvs = spec.partition(":")
            parts = [kv.partition("=") for kv in kvs.split("+") if kv]
            if not name or not parts or any(not k or not eq for k, eq, _ in parts):
                ap.error(f"--option-arms: {spec!r} is not NAME:key=value[+key=value]")
            pairs = tuple((k, v) for k, _, v in parts)
            plain.append((protocol, Arm(f"graph:{pols[0]}:d{depths[-1]}:{name}", "graph",
                                        pols[0], (), pols[0], pairs), depths[-1]))
        plain.append((protocol, ARMS[ROUTER[protocol]], None))
    # per window: every arm pinned, then (--also-shared) every arm unpinned
    arms = [(p, replace(a, label=a.label + tag), d) for tag, _ in pins for p, a, d in plain]
    pin_of = {a.label + tag: cpus for tag, cpus in pins for _, a, _ in plain}
    if pins[0][1] is not None:  # Ray's processes inherit the router CPUs from the start
        pinning.pin_router_side(pins[0][1][1])
    _minimal_agent()
    # Ray's node start-up fails on a busy host: the raylet waits a fixed time for the
    # dashboard agent's port file, and Python waits 30 s for the node to register
    for attempt in range(12):
        try:
            start_ray(2, base.serve.front)
            break
        except Exception as exc:
            print(f"ray start-up failed ({exc}); attempt {attempt + 1}", flush=True)
            try:
                stop_ray()
            except Exception as stop_exc:  # a half-started node may not answer either
                print(f"ray stop after a failed start: {stop_exc}", flush=True)
            if attempt == 11:
                raise
            time.sleep(10)
    rows: list[dict[str, Any]] = []
    try:
        for w in wins:
            for protocol, arm, depth in arms:
                cpus = pin_of[arm.label]  # (engine, router) CPUs, or None: unpinned
                pinning.pin_router_side(every_cpu if cpus is None else cpus[1])
                load = os.getloadavg()
                up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
                try:
                    reqs = w.requests(True, 1.0)
                    with pinning.engine_cpus(None if cpus is None else cpus[0]), \
                            pinning.AffinitySampler() as aff, CpuSampler() as cpu:
                        _CPU[:] = [cpu]
                        m = (run_router(arm, protocol, base, reqs, args.timeout)
                             if depth is None else
                             run_graph(protocol, base, arm.rule, depth, reqs, args.timeout,
                                       dict(arm.sim_options)))
                    m["affinity"] = aff.result()
                    m["cpu"] = cpu.result()
                except Exception as exc:  # recorded, not fatal
                    m = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
                m["host_load_1m"] = load[0]
                m["uptime"] = up
                m["cpus"] = (None if cpus is None else
                             {"engine": sorted(cpus[0]), "router": sorted(cpus[1])})
                rows.append({"arm": arm.label, "protocol": protocol, "router": arm.router,
                             "rule": arm.rule, "window": w.index, "window_start": w.start,
                             "mode": "saturated", "rate_scale": 1.0, "measured": m})
                eng = m.get("engine", {})
                print(f"{up}\n{time.strftime('%H:%M:%S')} load {load[0]:.1f} w{w.index} "
                      f"{protocol} {arm.label}: tok/s {m.get('output_tok_s')} tpot95 "
                      f"{m.get('tpot_p95_ms')} ttft50 {m.get('ttft_p50_ms')} running "
                      f"{eng.get('mean_running')} waiting {eng.get('mean_waiting')} "
                      f"lag {(m.get('engine_lag') or {}).get('lag_s')} "
                      f"lost {m.get('requests_lost')} {m.get('failed', '')}", flush=True)
                for r, v in list((m.get("cpu") or {}).get("roles", {}).items())[:10]:
                    print(f"    cpu {r}: {v['cpu_s']} s ({v['processes']} proc)", flush=True)
                for r, v in (m.get("affinity") or {}).get("roles", {}).items():
                    print(f"    {r}: {v['processes']} proc, cpus {v['cpus_allowed']}",
                          flush=True)
            write(args, base, depths, pols, arms, rows)  # partial results per window
    finally:
        stop_ray()
    write(args, base, depths, pols, arms, rows)
    return 0


def run_graph(protocol: str, base: Any, policy: str, depth: int, reqs: list[Any],
              timeout_s: float, options: dict[str, str] | None = None) -> dict[str, Any]:
    """``peers.run_arm``'s graph branch with ``policy`` (and its ``options``) and
    ``pool.dispatch_ahead`` (which only a remote-engine configuration accepts)."""
    t = time.perf_counter()
    with engine_processes(base, protocol) as (purl, durl):
        remote = parse_graph_config(base, engine=protocol, remote_prefill_urls=purl,
                                    remote_decode_urls=durl, remote_dp_size=base.replicas,
                                    remote_model=REMOTE_MODEL,
                                    serve_app_name=f"gap_{protocol}",
                                    policy={"name": policy, "options": options or {}},
                                    pool_dispatch_ahead=str(depth))
        since = peers._steps_now(durl)
        graph = _measure_graph(remote, reqs, timeout_s, durl)
        eng = peers.engine_metrics(durl, since)
        lag = engine_lag(durl, since)
    return {**peers.client_metrics(reqs), "engine": eng, "engine_lag": lag,
            "graph": {k: graph.get(k) for k in peers._GRAPH_KEYS},
            "run_wall_s": time.perf_counter() - t}


def run_router(arm: Arm, protocol: str, base: Any, reqs: list[Any], timeout_s: float
               ) -> dict[str, Any]:
    """``peers.run_arm``'s router branch, plus the engine's lag."""
    t = time.perf_counter()
    with engine_processes(base, protocol) as (purl, durl):
        port = free_port()
        with running_router(arm, port, purl, durl, base.replicas, REMOTE_MODEL, None):
            since = peers._steps_now(durl)
            asyncio.run(serve_bench._replay(port, reqs, timeout_s, REMOTE_MODEL))
        eng = peers.engine_metrics(durl, since)
        lag = engine_lag(durl, since)
    return {**peers.client_metrics(reqs), "engine": eng, "engine_lag": lag,
            "run_wall_s": time.perf_counter() - t}


def engine_lag(durl: str, since: int) -> dict[str, float] | None:
    """How far the decode emulator's lock-step loop fell behind its step model over the
    replay's busy steps (as ``research/ttft_breakdown.py``): ``lag_s`` = the wall span
    from the first busy step's start to the last one's end minus the modelled step
    durations summed; ``late_s``: the loop's own per-step lateness, summed."""
    rows = [r if isinstance(r, list) else [r[k] for k in
                                           ("step", "t_end_unix_s", "duration_s", "late_s",
                                            "loads", "running", "waiting")]
            for r in engine_steps(durl, since)["rows"]]
    busy = [r for r in rows if sum(r[5]) > 0]
    if not busy:
        return None
    span = busy[-1][1] - (busy[0][1] - busy[0][2])
    modelled = sum(r[2] for r in busy)
    # between two busy steps: wall time beyond the step's modelled duration; the part the
    # loop did not count as late is time with nothing to run (waiting for work or KV)
    gaps = [(b[1] - a[1] - b[2], b[3]) for a, b in itertools.pairwise(busy)]
    return {"steps": len(busy), "span_s": span, "modelled_s": modelled,
            "lag_s": span - modelled, "late_s": sum(r[3] for r in busy),
            "idle_s": sum(max(0.0, g - late) for g, late in gaps),
            "steps_log": [[round(r[1], 4), round(r[2], 4), round(r[3], 4), sum(r[5])]
                          for r in busy]}


def write(args: argparse.Namespace, base: Any, depths: list[int], pols: list[str],
          arms: list[tuple[str, Arm, Any]], rows: list[dict[str, Any]]) -> None:
    gains = []
    for protocol, arm, _ in arms:
        if arm.label.endswith("@pinned"):  # the effect of pinning on the arm itself
            shared = arm.label.replace("@pinned", "@shared")
            if any(a.label == shared for _, a, _ in arms):
                gains.append({"protocol": protocol, "arm": arm.label, "vs": shared, **{
                    "/".join(path): peers_report.gain(rows, protocol, "saturated", 1.0,
                                                      arm.label, shared, path)
                    for path in (*METRICS, *LAG)}})
        if arm.router != "graph":
            continue
        tag = arm.label[arm.label.find("@"):] if "@" in arm.label else ""
        refs = [ROUTER[protocol] + tag, f"graph:{arm.rule}:d0{tag}"]
        if arm.sim_options:  # a queued_load arm: also against the same depth's others
            refs += [a.label for p, a, _ in arms if p == protocol and a.sim_options
                     and a.label.rsplit(":", 1)[0] == arm.label.rsplit(":", 1)[0]
                     and a.label < arm.label]
        for ref in refs:
            if ref == arm.label or not any(a.label == ref for p, a, _ in arms
                                           if p == protocol):
                continue
            gains.append({"protocol": protocol, "arm": arm.label, "vs": ref, **{
                "/".join(path): peers_report.gain(rows, protocol, "saturated", 1.0,
                                                  arm.label, ref, path)
                for path in (*METRICS, *LAG)}})
    commit = args.commit
    result = {"config": {"trace": args.trace, "windows": args.windows,
                         "window": args.window, "max_output": args.max_output,
                         "max_prompt": args.max_prompt, "graph": base.model_dump(
                             exclude={"api_key"}), "depths": depths, "policies": pols,
                         "engine_cpus": args.engine_cpus, "router_cpus": args.router_cpus,
                         "also_shared": args.also_shared, "host_cpus": os.cpu_count(),
                         "commit": commit},
              "runs": rows, "summary": peers_report.summarise(rows), "gains": gains}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    for g in gains:
        print(json.dumps(g))
    print(f"wrote {out} ({len(rows)} runs)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
