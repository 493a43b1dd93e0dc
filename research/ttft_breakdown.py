"""Research: where the graph's time to first token goes, hop by hop (issue 28).

One live window per run (saturated: every request sent at t = 0; or, with ``--scale``,
arrival-timed as ``bench-peers --timed-scales`` replays it), each arm on fresh SGLang
emulators: the graph (``policy`` at ``pool.dispatch_ahead`` ``depth``; an arm
``graph+policy.options.KEY=VALUE+...`` sets policy options, JSON values) and smg's
``round_robin``. The emulators mark each request's hops in wall-clock time
(``/emulator/timeline``, keyed by the bootstrap room, joined to the client's request by
its seed); the client records its send and first-token times. Per request, seconds:

- ``to_prefill``: client send -> the prefill engine receives the request;
- ``prefill``: the prefill engine's modelled compute;
- ``to_decode``: client send -> the decode engine receives the request (smg: at once;
  the graph: ingress, prefill call, ticket, pool, tick, bind, decode replica), which for
  the graph is split by its actors' timelines (``timeline()`` RPCs) into
  ``to_pool`` (send -> the scheduler's pool), ``pool`` (pool -> bound), ``to_replica``
  (bound -> the replica's ``admit``), ``kv_pull`` (the replica's KV-lease pull),
  ``to_install`` (pulled -> installed by the step thread) and ``to_engine`` (installed
  -> the decode engine receives the call);
- ``kv_wait``: decode received -> the room's KV pulled (waits for the prefill);
- ``engine``: KV pulled -> the engine's first token (its queue and first step);
- ``back``: the engine's first token -> the client's first token (the return path);
- ``ttft``: the client's time to first token.

Printed and written: P50 / P95 per hop and arm, the engine's first step (from the
first send), and (graph) the scheduler's pool size polled from ``/v1/br/state``.

    python research/ttft_breakdown.py --trace ../shared/traces/servegen/deepseek_r1_5rps_1h.csv \
        --window 64 --set replicas=8 --set slots=4 --out results/peers/ttft_g8.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from br_serve.bench import peers
from br_serve.bench import serve_bench as sb
from br_serve.bench.peers_routers import ARMS, running_router
from br_serve.bench.remote_engines import REMOTE_MODEL, engine_processes, engine_steps
from br_serve.serve.cli import free_port, start_ray, stop_ray
from br_serve.serve.config import parse_graph_config
from br_serve.sim.stats import paired

HOPS = ("to_prefill", "prefill", "to_decode", "kv_wait", "engine", "back", "ttft")
GRAPH_HOPS = ("to_pool", "pool", "to_replica", "kv_pull", "to_install", "to_engine")


def graph_marks(cfg: Any) -> dict[int, dict[str, float]]:
    """The scheduler's and every decode replica's marks, merged, by seed."""
    import ray

    from br_serve.serve.actors import actor_names

    sname, dnames = actor_names(cfg.serve.app_name, cfg.replicas)
    ns = cfg.serve.namespace
    sched = ray.get(ray.get_actor(sname, namespace=ns).timeline.remote())["marks"]
    by_id = {rid: dict(m) for rid, m in sched.items()}
    for n in dnames:
        for rid, m in ray.get(ray.get_actor(n, namespace=ns).timeline.remote())[
                "marks"].items():
            by_id.setdefault(rid, {}).update(m)
    return {int(m["seed"]): m for m in by_id.values() if "seed" in m}


def _minimal_agent() -> None:
    """As in gap_bench.py: Ray's dashboard agent in its minimal mode (a busy host)."""
    import ray._private.utils as ray_utils

    ray_utils.get_dashboard_dependency_error = lambda: ImportError("minimal agent")


async def replay(port: int, reqs: list[Any], timeout_s: float, model: str = sb.MODEL
                 ) -> tuple[float, float]:
    """``serve_bench._replay`` that also returns the Unix time of its t0."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s,
                                 limits=limits) as client:
        t0, t0_unix = time.perf_counter(), time.time()
        await asyncio.gather(*(sb._one(client, r, t0, model) for r in reqs))
        return time.perf_counter() - t0, t0_unix


async def health_burst(port: int, n: int) -> dict[str, float]:
    """``n`` concurrent ``GET /health`` through the front door: the fan-in cost of a
    burst that does no routing work (P50 / max seconds)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                 limits=httpx.Limits(max_connections=2000)) as client:
        async def one() -> float:
            t = time.perf_counter()
            await client.get("/health")
            return time.perf_counter() - t
        xs = await asyncio.gather(*(one() for _ in range(n)))
    return {"p50_s": float(np.percentile(xs, 50)), "max_s": float(max(xs))}


def poll_pool(port: int, stop: threading.Event, out: list[tuple[float, int]]) -> None:
    with httpx.Client(timeout=5) as c:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # not up yet, or going down
                out.append((time.time(), int(c.get(
                    f"http://127.0.0.1:{port}/v1/br/state").json()["pool_size"])))
            stop.wait(0.1)


def timelines(purl: str, durl: str, reqs: list[Any], t0_unix: float,
              graph: dict[int, dict[str, float]] | None = None) -> list[dict[str, float]]:
    pm = httpx.get(f"{purl}/emulator/timeline", timeout=30).json()["marks"]
    dm = httpx.get(f"{durl}/emulator/timeline", timeout=30).json()["marks"]
    by_seed = {r.seed: r for r in reqs}
    # a request retried on the decode side (re-prefilled) has a second room with the
    # same seed: keep its first attempt, which the client's first token came from
    first: dict[int, str] = {}
    for room, d in dm.items():
        sd = int(d.get("seed", -1))
        if sd not in first or d.get("decode_in", 0.0) < dm[first[sd]].get("decode_in", 0.0):
            first[sd] = room
    rows = []
    for room in first.values():
        d = dm[room]
        p, r = pm.get(room, {}), by_seed.get(int(d.get("seed", -1)))
        need = ("prefill_in", "prefill_done")
        if r is None or not r.first_s or any(k not in p for k in need) or \
                "first_token" not in d:
            continue
        send = t0_unix + r.sent_s
        g = (graph or {}).get(r.seed)
        if g is not None and all(k in g for k in ("pool_in", "bound", "admit_in",
                                                  "kv_pulled", "installed")):
            extra = {"to_pool": g["pool_in"] - send, "pool": g["bound"] - g["pool_in"],
                     "to_replica": g["admit_in"] - g["bound"],
                     "kv_pull": g["kv_pulled"] - g["admit_in"],
                     "to_install": g["installed"] - g["kv_pulled"],
                     "to_engine": d["decode_in"] - g["installed"],
                     "ingress_clock_skew": g["arrival"] - send}
        else:
            extra = {}
        rows.append({**extra, "seed": r.seed, "rank": d.get("rank"),
                     "to_prefill": p["prefill_in"] - send,
                     "prefill": p["prefill_done"] - p["prefill_in"],
                     "to_decode": d["decode_in"] - send,
                     "decode_after_prefill_done": d["decode_in"] - p["prefill_done"],
                     "kv_wait": d["kv_ready"] - d["decode_in"],
                     "engine": d["first_token"] - d["kv_ready"],
                     "back": t0_unix + r.first_s - d["first_token"],
                     "ttft": r.first_s - r.sent_s})
    return rows


def refill(rows: list[dict[str, Any]], steps: list[tuple[float, float, list[int]]]
           ) -> dict[str, Any] | None:
    """For requests that started after the first round (engine first token > 3 s from
    t0): the slot they took was freed at the end of the step in which a request of
    their rank produced its last token (the step before the rank's running count fell);
    seconds from then to their first token (the slot's idle time, an upper bound of
    the time a queued request waits: one step), and (graph) its parts: freed -> bound,
    bound -> decode engine received. ``steps``: (end s from t0, duration s, running
    per rank)."""
    out: dict[str, list[float]] = {"freed_to_first_token": [], "freed_to_bound": [],
                                   "bound_to_decode": []}
    for r in rows:
        start = r["to_decode"] + r["kv_wait"] + r["engine"]  # first token, from t0
        if start < 3.0 or r.get("rank") is None:
            continue
        g, freed = int(r["rank"]), None
        for prev, cur in itertools.pairwise(steps):
            if cur[0] >= start:
                break
            if cur[2][g] < prev[2][g]:
                freed = prev[0]
        if freed is None:
            continue
        out["freed_to_first_token"].append(start - freed)
        if "pool" in r:
            bound = r["to_pool"] + r["pool"]
            out["freed_to_bound"].append(bound - freed)
            out["bound_to_decode"].append(r["to_decode"] - bound)
    return {k: {"n": len(v), "p50_s": float(np.percentile(v, 50)),
                "mean_s": float(np.mean(v))} for k, v in out.items() if v} or None


def idle_while_pooled(run: dict[str, Any], slots: int) -> float:
    """Slot-seconds the decode engines left free while the graph's pool held requests
    (the last ``/v1/br/state`` poll before each step's end; 0 for a router arm)."""
    polls = run.get("pool_polls") or []
    if not polls:
        return 0.0
    at = np.asarray([p[0] for p in polls])
    out = 0.0
    for end, dur, running in run["steps"]:
        i = int(np.searchsorted(at, end)) - 1
        if i >= 0 and polls[i][1] > 0:
            out += dur * sum(max(0, slots - x) for x in running)
    return out


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for h in (*HOPS, "decode_after_prefill_done", *GRAPH_HOPS):
        xs = [r[h] for r in rows if h in r]
        out[h] = {"p50_s": float(np.percentile(xs, 50)), "p95_s": float(np.percentile(xs, 95)),
                  "mean_s": float(np.mean(xs))} if xs else None
    return out


def run(arm: str, base: Any, reqs: list[Any], policy: str, depth: int,
        timeout_s: float) -> dict[str, Any]:
    from ray import serve

    from br_serve.serve.graph import deploy

    pool: list[tuple[float, int]] = []
    graph = None
    with engine_processes(base, "sglang") as (purl, durl):
        if arm.startswith("graph"):  # "graph" or "graph+key=value+...": config overrides
            over = dict(kv.split("=", 1) for kv in arm.split("+")[1:])
            popts = {k.removeprefix("policy.options."): json.loads(over.pop(k))
                     for k in list(over) if k.startswith("policy.options.")}
            cfg = parse_graph_config(base, engine="sglang", remote_prefill_urls=purl,
                                     remote_decode_urls=durl, remote_dp_size=base.replicas,
                                     remote_model=REMOTE_MODEL, serve_app_name="ttft",
                                     policy={"name": policy, "options": popts},
                                     pool_dispatch_ahead=str(depth),
                                     **{k.replace(".", "_"): v for k, v in over.items()})
            deploy(cfg)
            burst = asyncio.run(health_burst(cfg.serve.port, len(reqs)))
            since = peers._steps_now(durl)  # after the graph's start-up probe
            stop = threading.Event()
            th = threading.Thread(target=poll_pool, args=(cfg.serve.port, stop, pool))
            th.start()
            try:
                _, t0_unix = asyncio.run(replay(cfg.serve.port, reqs, timeout_s))
            finally:
                stop.set()
                th.join()
            graph = graph_marks(cfg)
            serve.delete(cfg.serve.app_name)
        else:
            port = free_port()
            with running_router(ARMS[arm], port, purl, durl, base.replicas,
                                REMOTE_MODEL, None):
                burst = asyncio.run(health_burst(port, len(reqs)))
                since = peers._steps_now(durl)  # after the router's start-up request
                _, t0_unix = asyncio.run(replay(port, reqs, timeout_s, REMOTE_MODEL))
        log = engine_steps(durl, since)
        rows = timelines(purl, durl, reqs, t0_unix, graph)
        eng = peers.engine_metrics(durl, since)
    cols = ("step", "t_end_unix_s", "duration_s", "late_s", "loads", "running", "waiting")
    steps = [dict(zip(cols, r, strict=True)) if isinstance(r, list) else r
             for r in log["rows"]]
    busy = [s for s in steps if sum(s["running"]) > 0]
    first_step = (min(s["t_end_unix_s"] - s["duration_s"] for s in busy) - t0_unix
                  if busy else None)
    last_step = max(s["t_end_unix_s"] for s in busy) - t0_unix if busy else None
    compact = [(s["t_end_unix_s"] - t0_unix, s["duration_s"], list(s["running"]))
               for s in busy]
    return {"client": peers.client_metrics(reqs), "hops": summary(rows),
            "health_burst": burst,
            "engine_first_step_s": first_step, "engine_last_step_s": last_step,
            "engine_steps": len(busy), "engine": {k: eng.get(k) for k in
                                                  ("mean_running", "mean_waiting")},
            "pool_polls": [(t - t0_unix, n) for t, n in pool], "requests": rows,
            "steps": compact, "refill": refill(rows, compact)}


def table(res: dict[str, Any]) -> str:
    """Per arm: the mean over windows of each hop's P50 (P95) and of the client's
    numbers; then each arm's paired difference from the last arm (the router)."""
    runs = res["runs"]
    for r in runs:  # recomputed from the saved rows (older files lack it)
        if "steps" in r:
            r["refill"] = refill(r["requests"], [tuple(x) for x in r["steps"]])
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    cols = ("to_prefill", "to_pool", "pool", "to_decode", "kv_wait", "engine", "back",
            "ttft")
    out = ["| arm | n | tok/s | engine 1st step s | " + " | ".join(
        f"{c} P50 (P95) s" for c in cols) + " | /health burst P50 s | host load |",
        "|---" * (len(cols) + 6) + "|"]
    for a in arms:
        rs = [r for r in runs if r["arm"] == a]

        def m(get: Any, rs: list[dict[str, Any]] = rs) -> float:
            xs = [get(r) for r in rs]
            xs = [x for x in xs if x is not None]
            return float(np.mean(xs)) if xs else float("nan")

        cells = []
        for c in cols:
            p50 = m(lambda r, c=c: (r["hops"].get(c) or {}).get("p50_s"))
            p95 = m(lambda r, c=c: (r["hops"].get(c) or {}).get("p95_s"))
            cells.append("-" if np.isnan(p50) else f"{p50:.2f} ({p95:.2f})")
        loads = [r["host_load_1m"] for r in rs]
        out.append(f"| {a} | {len(rs)} | {m(lambda r: r['client']['output_tok_s']):.1f} | "
                   f"{m(lambda r: r['engine_first_step_s']):.2f} | " + " | ".join(cells)
                   + f" | {m(lambda r: r['health_burst']['p50_s']):.2f} | "
                   f"{min(loads):.1f}-{max(loads):.1f} |")
    out.append("")
    for a in arms:
        for k in ("freed_to_first_token", "freed_to_bound", "bound_to_decode"):
            xs = [r["refill"][k] for r in runs if r["arm"] == a and r.get("refill")
                  and k in r["refill"]]
            if xs:
                out.append(f"- {a}, late starts, {k}: P50 "
                           f"{np.mean([x['p50_s'] for x in xs]):.2f} s, mean "
                           f"{np.mean([x['mean_s'] for x in xs]):.2f} s (n = "
                           f"{sum(x['n'] for x in xs)} requests, {len(xs)} windows)")
    # every arm against the last (the router), then each graph arm against the first
    pairs = [(a, arms[-1]) for a in arms[:-1]] + [(a, arms[0]) for a in arms[1:-1]]
    for a, ref in pairs:
        getters: tuple[tuple[str, Callable[[dict[str, Any]], float]], ...] = (
                          ("TTFT P50 s", lambda r: r["hops"]["ttft"]["p50_s"]),
                          ("TTFT P95 s", lambda r: r["hops"]["ttft"]["p95_s"]),
                          ("engine steps", lambda r: float(r["engine_steps"])),
                          ("idle slot-s while pooled", lambda r: idle_while_pooled(
                              r, int(res["config"]["graph"]["slots"]))),
                          ("TTFT mean s", lambda r: r["hops"]["ttft"]["mean_s"]),
                          ("engine first step s", lambda r: r["engine_first_step_s"]),
                          ("send->pool/decode P50 s", lambda r: (
                              r["hops"].get("to_pool") or r["hops"]["to_decode"])["p50_s"]),
                          ("output tok/s %", lambda r: r["client"]["output_tok_s"]),
                          ("TPOT P95 %", lambda r: r["client"]["tpot_p95_ms"]))
        for name, get in getters:
            d: list[float] = []
            for w in sorted({r["window"] for r in runs}):
                x = [r for r in runs if r["arm"] == a and r["window"] == w]
                y = [r for r in runs if r["arm"] == ref and r["window"] == w]
                if x and y:
                    d.append(get(x[0]) / get(y[0]) * 100 - 100 if name.endswith("%")
                             else get(x[0]) - get(y[0]))
            if d:
                st = paired(d)
                lo, hi = st.ci95 or (float("nan"), float("nan"))
                out.append(f"- {a} - {ref}, {name}: {st.mean:+.2f} "
                           f"[{lo:+.2f}, {hi:+.2f}] (n = {st.n})")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace")
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="print the markdown table of written JSONs (their runs pooled: "
                    "the same arms and slots, different windows) and exit")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--windows", default="0", help="window indices, comma-separated")
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=16384)
    ap.add_argument("--scale", type=float, default=0.0,
                    help="0: saturated (every request at t = 0); else arrival-timed, the "
                    "window's arrivals divided by this (as bench-peers --timed-scales)")
    ap.add_argument("--policy", default="br0")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--arms", default="graph,smg:round_robin")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", default="results/peers/ttft_g8.json")
    args = ap.parse_args()
    if args.table:
        parts = [json.loads(Path(f).read_text()) for f in args.table]
        print(table({"config": parts[0]["config"],
                     "runs": [r for p in parts for r in p["runs"]]}))
        return 0
    if not args.trace:
        ap.error("--trace is required (unless --table)")
    if args.scale < 0:
        ap.error(f"--scale: must be >= 0 (got {args.scale})")
    opts = {"replicas": "8", "slots": "4", "engine_slowdown": "2",
            "serve_port": str(free_port()), "pool_capacity": "4096"}
    for kv in args.set:
        k, v = kv.split("=", 1)
        opts[k.replace(".", "_")] = v
    base = parse_graph_config(opts)
    idx = [int(i) for i in args.windows.split(",")]
    wins = peers.windows(args.trace, max(idx) + 1, args.window, args.max_prompt,
                         args.max_output, base.seed)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    _minimal_agent()
    start_ray(2, base.serve.front)
    runs: list[dict[str, Any]] = []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    try:
        for i in idx:
            for arm in arms:
                load = os.getloadavg()
                up = subprocess.run(["uptime"], capture_output=True, text=True).stdout
                reqs = (wins[i].requests(True) if args.scale == 0
                        else wins[i].requests(False, args.scale))
                res = run(arm, base, reqs, args.policy, args.depth, args.timeout)
                res.update(arm=arm, window=i, host_load_1m=load[0], uptime=up.strip())
                runs.append(res)
                h = res["hops"]
                print(f"{up.strip()}\nhealth burst {res['health_burst']}", flush=True)
                print(f"refill {json.dumps(res['refill'])}", flush=True)
                print(f"w{i} {arm}: tok/s {res['client']['output_tok_s']:.1f} "
                      f"first step {res['engine_first_step_s']:.2f} s, last "
                      f"{res['engine_last_step_s']:.2f} s, steps {res['engine_steps']}",
                      flush=True)
                for k in (*HOPS, "decode_after_prefill_done", *GRAPH_HOPS):
                    if h.get(k):
                        print(f"  {k:>26}: P50 {h[k]['p50_s']:7.3f}  P95 "
                              f"{h[k]['p95_s']:7.3f}  mean {h[k]['mean_s']:7.3f}", flush=True)
                Path(args.out).write_text(json.dumps(
                    {"config": {**vars(args), "graph": base.model_dump(exclude={"api_key"}),
                                "commit": commit}, "runs": runs}, indent=1, default=str))
    finally:
        stop_ray()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
