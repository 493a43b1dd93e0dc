"""Research: which hop leaves the ranks under-filled under dispatch ahead (issue 28).

One live window, the graph with ``pool.dispatch_ahead`` at each depth given, on fresh
emulators. While the replay runs, the scheduler's state (``/v1/br/state``: pool size,
bound requests and free places per replica) is polled; afterwards the decode
emulator's step log (``/emulator/steps``) and its admitted ids per rank
(``/emulator/stats``) are read. Printed per depth:

- ``admitted``: requests each rank's engine received (a second admission of an id is
  counted in ``twice``);
- ``idle_beside_queue``: share of engine steps in which some rank ran fewer than
  ``slots`` requests while another held one waiting (a request queued at one rank
  while a slot stood free at another: binding that is not work-conserving);
- ``idle_no_queue``: share of steps with a free slot somewhere and nothing waiting
  anywhere (the engine lacked work);
- ``pool_with_places``: share of state polls with requests in the pool while the
  scheduler counted a free place (the scheduler did not bind what it could);
- ``pool_empty``: share of polls with an empty pool.

    python research/ahead_diag.py --trace ../shared/traces/servegen/deepseek_r1_5rps_1h.csv \
        --window 64 --depths 0,2 --set replicas=8 --set slots=4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections import Counter
from typing import Any

import httpx

from br_serve.bench import peers
from br_serve.bench.remote_engines import REMOTE_MODEL, engine_processes, engine_steps
from br_serve.bench.serve_bench import _replay
from br_serve.serve.cli import free_port, start_ray, stop_ray
from br_serve.serve.config import parse_graph_config


def _minimal_agent() -> None:
    """As in gap_bench.py: Ray's dashboard agent in its minimal mode (a busy host)."""
    import ray._private.utils as ray_utils

    ray_utils.get_dashboard_dependency_error = lambda: ImportError("minimal agent")


def poll_state(port: int, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    with httpx.Client(timeout=5) as c:
        while not stop.is_set():
            try:
                s = c.get(f"http://127.0.0.1:{port}/v1/br/state").json()
                out.append({"t": time.time(), "pool": s["pool_size"],
                            "in_flight": s.get("in_flight"),
                            "running": [r["running"] for r in s["replicas"]],
                            "free": [r["free_slots"] for r in s["replicas"]]})
            except Exception as exc:  # the graph is not up yet, or going down
                out.append({"t": time.time(), "error": str(exc)[:80]})
            stop.wait(0.05)


def run(base: Any, protocol: str, depth: int, reqs: list[Any], policy: str,
        timeout_s: float) -> dict[str, Any]:
    from ray import serve

    from br_serve.serve.graph import deploy

    with engine_processes(base, protocol) as (purl, durl):
        cfg = parse_graph_config(base, engine=protocol, remote_prefill_urls=purl,
                                 remote_decode_urls=durl, remote_dp_size=base.replicas,
                                 remote_model=REMOTE_MODEL, serve_app_name="ahead_diag",
                                 policy={"name": policy}, pool_dispatch_ahead=str(depth))
        since = peers._steps_now(durl)
        deploy(cfg)
        polls: list[dict[str, Any]] = []
        stop = threading.Event()
        th = threading.Thread(target=poll_state, args=(cfg.serve.port, stop, polls))
        th.start()
        try:
            asyncio.run(_replay(cfg.serve.port, reqs, timeout_s))
        finally:
            stop.set()
            th.join()
        log = engine_steps(durl, since)
        stats = httpx.get(f"{durl}/emulator/stats", timeout=30).json()
        serve.delete(cfg.serve.app_name)
    return {"client": peers.client_metrics(reqs), "rows": log["rows"], "polls": polls,
            "stats": stats}


def analyse(res: dict[str, Any], slots: int) -> dict[str, Any]:
    rows = res["rows"]
    cols = ("step", "t_end_unix_s", "duration_s", "late_s", "loads", "running", "waiting")
    rows = [dict(zip(cols, r, strict=True)) if isinstance(r, list) else r for r in rows]
    beside = none = 0
    for r in rows:
        free = any(n < slots for n in r["running"])
        if free and any(w > 0 for w in r["waiting"]):
            beside += 1
        elif free:
            none += 1
    ranks = res["stats"].get("ranks") or res["stats"].get("per_rank") or []
    admitted = [len(r.get("admitted", [])) for r in ranks]
    ids = Counter(i for r in ranks for i in r.get("admitted", []))
    polls = [p for p in res["polls"] if "pool" in p]
    busy = [p for p in polls if sum(p["running"]) > 0 or p["pool"] > 0]
    with_places = sum(1 for p in busy if p["pool"] > 0 and sum(p["free"]) > 0)
    empty = sum(1 for p in busy if p["pool"] == 0)
    return {"steps": len(rows), "tok_s": res["client"]["output_tok_s"],
            "lost": res["client"]["requests_lost"], "admitted": admitted,
            "twice": sum(1 for v in ids.values() if v > 1),
            "idle_beside_queue": beside / max(len(rows), 1),
            "idle_no_queue": none / max(len(rows), 1),
            "polls": len(busy), "pool_with_places": with_places / max(len(busy), 1),
            "pool_empty": empty / max(len(busy), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--window-index", type=int, default=0)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=16384)
    ap.add_argument("--protocol", default="sglang")
    ap.add_argument("--policy", default="br0")
    ap.add_argument("--depths", default="0,2")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", default=None, help="raw rows and polls (JSON)")
    args = ap.parse_args()
    opts = {"replicas": "8", "slots": "4", "engine_slowdown": "2",
            "serve_port": str(free_port()), "pool_capacity": "4096"}
    for kv in args.set:
        k, v = kv.split("=", 1)
        opts[k.replace(".", "_")] = v
    base = parse_graph_config(opts)
    w = peers.windows(args.trace, args.window_index + 1, args.window, args.max_prompt,
                      args.max_output, base.seed)[args.window_index]
    _minimal_agent()
    start_ray(2)
    raw: dict[str, Any] = {}
    try:
        for d in [int(x) for x in args.depths.split(",")]:
            load = os.getloadavg()[0]
            res = run(base, args.protocol, d, w.requests(True, 1.0), args.policy,
                      args.timeout)
            a = analyse(res, base.slots)
            print(f"load {load:.1f} d={d}: {json.dumps(a)}", flush=True)
            raw[f"d{d}"] = {"summary": a, "load_1m": load, **res}
    finally:
        stop_ray()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(raw, f, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
