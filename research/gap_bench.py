"""Research: the graph's slot turnover before/after dispatch ahead (issue 28), paired.

Per window (outermost) and protocol, every arm on fresh emulator pairs, interleaved:
the graph with ``pool.dispatch_ahead`` = 0 (binding only free slots: the old path) and
> 0, for each policy given, and the protocol's real ``round_robin`` router. Reports the
paired gains of every graph arm over the router and over the graph with depth 0, plus
the engine's mean running / waiting requests per rank (the turnover gap at the engine).

    nice -n 10 .venv/bin/python research/gap_bench.py \
        --trace ../shared/traces/servegen/deepseek_r1_5rps_1h.csv --windows 4 --window 48 \
        --out results/peers/gap_servegen_g4.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from br_serve.bench import peers, peers_report
from br_serve.bench.peers_routers import ARMS, Arm
from br_serve.bench.remote_engines import REMOTE_MODEL, engine_processes
from br_serve.bench.serve_bench import _measure_graph
from br_serve.serve.cli import free_port, start_ray, stop_ray
from br_serve.serve.config import parse_graph_config

ROUTER = {"sglang": "smg:round_robin", "vllm": "vllm-router:round_robin"}
METRICS = (("output_tok_s",), ("tpot_p50_ms",), ("tpot_p95_ms",), ("ttft_p50_ms",),
           ("ttft_p95_ms",), ("engine", "mean_imbalance_tokens"))


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
    ap.add_argument("--window", type=int, default=48)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=16384)
    ap.add_argument("--protocols", default="sglang,vllm")
    ap.add_argument("--policies", default="br0,jsq")
    ap.add_argument("--depths", default="0,2", help="pool.dispatch_ahead values (br0)")
    ap.add_argument("--queued-loads", default="",
                    help="br0's policy.options.queued_load values, one arm each at every "
                         "depth > 0 (empty: the policy's default, one arm)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", default="results/peers/gap_servegen_g4.json")
    args = ap.parse_args()
    opts = {"replicas": "4", "slots": "8", "engine_slowdown": "2", "serve_port":
            str(free_port()), "pool_capacity": "4096"}
    for kv in args.set:
        k, v = kv.split("=", 1)
        opts[k.replace(".", "_")] = v
    base = parse_graph_config(opts)
    wins = peers.windows(args.trace, args.windows, args.window, args.max_prompt,
                         args.max_output, base.seed)
    depths = [int(d) for d in args.depths.split(",")]
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    qls = [q.strip() for q in args.queued_loads.split(",") if q.strip()]
    arms: list[tuple[str, Arm, Any]] = []
    for protocol in [p.strip() for p in args.protocols.split(",") if p.strip()]:
        for pol in pols:
            for d in (depths if pol == pols[0] else depths[-1:]):
                if d and pol == "br0" and qls:  # one arm per queued_load (an option)
                    arms += [(protocol, Arm(f"graph:{pol}:d{d}:{q}", "graph", pol, (), pol,
                                            (("queued_load", q),)), d) for q in qls]
                else:
                    arms.append((protocol, Arm(f"graph:{pol}:d{d}", "graph", pol, (), pol),
                                 d))
        arms.append((protocol, ARMS[ROUTER[protocol]], None))
    _minimal_agent()
    # Ray's node start-up fails on a busy host: the raylet waits a fixed time for the
    # dashboard agent's port file, and Python waits 30 s for the node to register
    for attempt in range(12):
        try:
            start_ray(2)
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
                load = os.getloadavg()
                try:
                    reqs = w.requests(True, 1.0)
                    m = (peers.run_arm(arm, protocol, base, reqs, args.timeout)
                         if depth is None else
                         run_graph(protocol, base, arm.rule, depth, reqs, args.timeout,
                                   dict(arm.sim_options)))
                except Exception as exc:  # recorded, not fatal
                    m = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
                m["host_load_1m"] = load[0]
                rows.append({"arm": arm.label, "protocol": protocol, "router": arm.router,
                             "rule": arm.rule, "window": w.index, "window_start": w.start,
                             "mode": "saturated", "rate_scale": 1.0, "measured": m})
                eng = m.get("engine", {})
                print(f"{time.strftime('%H:%M:%S')} load {load[0]:.1f} w{w.index} "
                      f"{protocol} {arm.label}: tok/s {m.get('output_tok_s')} tpot95 "
                      f"{m.get('tpot_p95_ms')} ttft50 {m.get('ttft_p50_ms')} running "
                      f"{eng.get('mean_running')} waiting {eng.get('mean_waiting')} "
                      f"lost {m.get('requests_lost')} {m.get('failed', '')}", flush=True)
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
    return {**peers.client_metrics(reqs), "engine": eng,
            "graph": {k: graph.get(k) for k in peers._GRAPH_KEYS},
            "run_wall_s": time.perf_counter() - t}


def write(args: argparse.Namespace, base: Any, depths: list[int], pols: list[str],
          arms: list[tuple[str, Arm, Any]], rows: list[dict[str, Any]]) -> None:
    gains = []
    for protocol, arm, _ in arms:
        if arm.router != "graph":
            continue
        refs = [ROUTER[protocol], f"graph:{arm.rule}:d0"]
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
                for path in METRICS}})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"config": {"trace": args.trace, "windows": args.windows,
                         "window": args.window, "max_output": args.max_output,
                         "max_prompt": args.max_prompt, "graph": base.model_dump(
                             exclude={"api_key"}), "depths": depths, "policies": pols,
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
