"""``br-serve`` subcommands of the serving graph: ``serve``, ``demo``, ``bench-serve``.

Graph options are passed as ``--set key=value`` (any :class:`GraphConfig` field, the
same names as the ``serve run ... key=value`` builder arguments); a bad one exits 2 with
a message naming it. Ray and the graph are imported inside the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from br_serve.serve.config import GraphConfig, parse_graph_config


def _kv(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items:
        key, sep, val = it.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected key=value (got {it!r})")
        out[key] = val
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_ray(num_cpus: int | None) -> None:
    # Local single-user clusters: Ray's token auth would need a token per client.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(include_dashboard=False, num_cpus=num_cpus,
             object_store_memory=512 * 1024**2, log_to_driver=False)


def _stop_ray() -> None:
    import ray
    from ray import serve

    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def cmd_serve(args: argparse.Namespace) -> int:
    """Deploy on a local Ray and serve until interrupted (``serve run`` equivalent)."""
    cfg = parse_graph_config(_kv(args.set))
    from br_serve.serve.graph import deploy

    _start_ray(args.num_cpus)
    try:
        deploy(cfg)
        print(f"serving {cfg.model!r} on http://{cfg.host}:{cfg.port}/v1 "
              f"(G={cfg.replicas}, policy={cfg.policy}); Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    finally:
        _stop_ray()


async def _demo_requests(cfg: GraphConfig, n: int, max_tokens: int) -> list[dict[str, Any]]:
    import asyncio

    import httpx

    headers = {}
    key = cfg.resolved_api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with httpx.AsyncClient(base_url=f"http://{cfg.host}:{cfg.port}", timeout=120,
                                 headers=headers) as c:
        async def one(i: int) -> dict[str, Any]:
            prompt = " ".join(["word"] * (20 + 97 * i))
            t0 = time.perf_counter()
            r = await c.post("/v1/completions", json={
                "model": cfg.model, "prompt": prompt, "max_tokens": max_tokens, "seed": i})
            body = r.json()
            return {"status": r.status_code, "latency_s": round(time.perf_counter() - t0, 3),
                    "usage": body.get("usage"),
                    "text": body["choices"][0]["text"][:40] if r.status_code == 200 else body}

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def cmd_demo(args: argparse.Namespace) -> int:
    """Start local Ray, deploy the default graph, send requests, print, shut down."""
    import asyncio

    opts = {"port": str(_free_port()), **_kv(args.set)}
    cfg = parse_graph_config(opts)
    from br_serve.serve.graph import deploy

    _start_ray(args.num_cpus)
    try:
        t0 = time.perf_counter()
        deploy(cfg)
        print(f"deployed G={cfg.replicas} policy={cfg.policy} on "
              f"http://{cfg.host}:{cfg.port} in {time.perf_counter() - t0:.1f}s", flush=True)
        results = asyncio.run(_demo_requests(cfg, args.requests, args.max_tokens))
        for i, r in enumerate(results):
            print(f"request {i}: {json.dumps(r)}")
        import httpx

        key = cfg.resolved_api_key()
        hdr = {"Authorization": f"Bearer {key}"} if key else {}
        state = httpx.get(f"http://{cfg.host}:{cfg.port}/v1/br/state", headers=hdr).json()
        print("state:", json.dumps(state))
        ok = all(r["status"] == 200 and r["usage"]["completion_tokens"] == args.max_tokens
                 for r in results)
        print("demo:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        _stop_ray()


def cmd_bench(args: argparse.Namespace) -> int:
    from br_serve.serve.bench import run_bench

    if args.resimulate:
        return _resimulate(args)
    opts = {"replicas": "8", "port": str(_free_port()), "pool_capacity": "4096",
            **_kv(args.set)}
    base = parse_graph_config(opts)
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
    for p in policies:
        parse_graph_config(base.model_dump(), policy=p)  # names a bad policy up front
    _start_ray(args.num_cpus)
    try:
        res = run_bench(base, policies, trace, Path(args.out), args.timeout,
                        repeats=args.repeats, jitter_s=args.sim_jitter, seeds=args.sim_seeds,
                        workload=workload, overhead_from=args.overhead_from)
    finally:
        _stop_ray()
    lost = sum(r["measured"]["requests_lost"] + r["measured"]["bad_tokens"]
               for r in res["runs"])
    print(f"wrote {args.out}")
    return 0 if lost == 0 else 1


def _workload(w: dict[str, Any]) -> Any:
    from br_serve.serve.bench import load_workload

    return load_workload(w["trace"], w["requests"], w["arrival_scale"], w["max_output"],
                         w["max_prompt"], w["seed"])


def _resimulate(args: argparse.Namespace) -> int:
    """Recompute the simulator's side of an earlier run's JSON (no Ray, no HTTP)."""
    from br_serve.serve.bench import report

    path = Path(args.resimulate)
    if not path.exists():
        raise FileNotFoundError(f"--resimulate: no such file {path}")
    old = json.loads(path.read_text())
    if not old.get("workload") or "runs" not in old:
        raise ValueError(f"--resimulate: {path} has no workload or runs (not a "
                         "bench-serve result of this version)")
    base = parse_graph_config(old["config"])
    keep = ("config", "workload", "requests", "repeats", "runs")
    res = {k: old[k] for k in keep if k in old}
    res["sim_jitter_s"], res["sim_seeds"] = args.sim_jitter, args.sim_seeds
    report(res, _workload(old["workload"]), base, Path(args.out), args.overhead_from)
    print(f"wrote {args.out}")
    return 0


def register(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="graph option (GraphConfig field), repeatable")
    common.add_argument("--num-cpus", type=int, default=None,
                        help="CPUs for the local Ray (default: all)")

    p = sub.add_parser("serve", parents=[common], help="serve the graph on a local Ray")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", parents=[common],
                       help="deploy locally, send a few requests, print, exit")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench-serve", parents=[common],
                       help="replay a trace over HTTP per policy, beside the simulator")
    p.add_argument("--trace", default=None, help="trace file (default: synthetic)")
    p.add_argument("--requests", type=int, default=200, help="first N requests")
    p.add_argument("--arrival-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the rate)")
    p.add_argument("--max-output", type=int, default=256, help="clip outputs (tokens)")
    p.add_argument("--max-prompt", type=int, default=32768, help="clip prompts (tokens)")
    p.add_argument("--policies", default="jsq,br0,brh")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="live runs per policy, interleaved (gains: mean and s.e.)")
    p.add_argument("--sim-jitter", type=float, default=0.05,
                   help="simulator ensemble: arrival jitter s.d. in seconds")
    p.add_argument("--sim-seeds", type=int, default=16,
                   help="simulator ensemble: jittered replays per policy")
    p.add_argument("--overhead-from", choices=("jsq", "own"), default="jsq",
                   help="calibrate the simulator's host overhead per step on the jsq runs "
                        "(default; others out of sample) or on each policy's own runs")
    p.add_argument("--resimulate", default=None, metavar="RESULT_JSON",
                   help="only redo the simulator side of an earlier result (to --out)")
    p.add_argument("--out", default="results/serve_bench.json")
    p.set_defaults(func=cmd_bench)


if __name__ == "__main__":  # pragma: no cover
    from br_serve.cli import main

    sys.exit(main())
