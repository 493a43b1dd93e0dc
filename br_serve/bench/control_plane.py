"""``br-serve bench-control-plane``: what the live graph's own per-step protocol costs.

Deploys the graph with a near-zero emulated step (``step_b_s=0.002``,
``step_a_s_per_token=0``: almost all of a step is the graph's own work), sends one
request right after the deployment reports ready (``first_token_s``: its time to first
token), then ``--streams`` concurrent streaming completions of ``--tokens`` tokens over
HTTP, and reports

- ``steps_per_s`` / ``ms_per_step``: the decode step rate in the steady state, while
  every stream is running (from the last stream's first token to the first stream's
  last one), counted at the barrier: the slope of the scheduler's busy-step counter,
  sampled every 0.5 s, over that window (over the whole busy period when the window
  holds fewer than two samples). Token arrival times at the client would overstate
  it: a stream that fell behind catches up in bursts of tokens written together.
  ``steps_per_s_lifetime``: the median over streams of ``(tokens - 2) / (last token -
  second token)`` as the client sees them (prefill ramp and catch-up included);
- ``streamed_tok_s``: tokens received by the clients per second of the load;
- ``busy_steps``: decode steps with work, counted at the barrier by the scheduler;
- ``cpu_s_per_step``: CPU seconds (user + system, from ``/proc``) of each actor kind
  (decode replicas summed, scheduler, ingress, prefill, KV keeper, Serve's proxy and
  controller, Ray's raylet and GCS, the client) divided by ``busy_steps``.

``--profile DIR`` also records one process of each kind with ``py-spy`` (collapsed
stacks, ``--nonblocking`` so the targets are not paused, ``--gil``: only the thread running
Python, i.e. where the CPU goes) for ``--profile-s`` seconds in
the middle of the load, and writes ``DIR/<kind>.txt`` plus ``DIR/summary.json`` (the
functions with the most samples, on their own and with what they call).

The file only uses what every version of the graph has (``deploy``, the scheduler's
``stats``), so the same command runs against an older checkout for comparison:
``PYTHONPATH=/tmp/old python br_serve/bench/control_plane.py --replicas 8 ...``.
Everything runs on this host (one Ray node, 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

MODEL = "br-emulated"
APP = "cplane"
NS = "br_serve"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (and its reaped children: none)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _processes(replicas: int) -> dict[str, list[int]]:
    """PIDs of every process of the graph, by kind."""
    import ray

    def pid_of(handle: Any) -> int:
        return int(ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=30))

    kinds: dict[str, list[int]] = {"decode": [], "scheduler": [], "keeper": [],
                                   "ingress": [], "prefill": [], "proxy": [],
                                   "controller": [], "raylet+gcs": [], "client": [os.getpid()]}
    for g in range(replicas):
        kinds["decode"].append(pid_of(ray.get_actor(f"{APP}:decode:{g}", namespace=NS)))
    kinds["scheduler"].append(pid_of(ray.get_actor(f"{APP}:scheduler", namespace=NS)))
    with contextlib.suppress(ValueError):
        kinds["keeper"].append(pid_of(ray.get_actor(f"{APP}:kv", namespace=NS)))
    for a in ray.util.list_named_actors(all_namespaces=True):
        name = a["name"]
        kind = ("ingress" if name.startswith(f"SERVE_REPLICA::{APP}#Ingress#") else
                "prefill" if name.startswith(f"SERVE_REPLICA::{APP}#Prefill#") else
                "proxy" if name.startswith("SERVE_PROXY_ACTOR") else
                "controller" if name.startswith("SERVE_CONTROLLER_ACTOR") else None)
        if kind is not None:
            kinds[kind].append(pid_of(ray.get_actor(name, namespace=a["namespace"])))
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")[0]
            except OSError:
                continue
            if cmd.endswith((b"/raylet", b"/gcs_server")):
                kinds["raylet+gcs"].append(int(pid))
    return kinds


def _cpu_by_kind(kinds: dict[str, list[int]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind, pids in kinds.items():
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                total += _cpu_s(pid)
        out[kind] = total
    return out


#: how each token's SSE event starts (error events start with {"error" and do not count)
_TOKEN_EVENT = b'data: {"id"'


async def _stream(client: Any, i: int, tokens: int, t0: float) -> dict[str, Any]:
    """One streaming completion; the arrival time of each token event. Counts events in
    the raw bytes (a marker split across reads is kept): the client must not be the
    bottleneck of a control-plane benchmark, and exactness is tested elsewhere."""
    payload = {"model": MODEL, "prompt": " ".join(["w"] * (4 + i % 4)),
               "max_tokens": tokens, "seed": i, "stream": True}
    times: list[float] = []
    sent = time.perf_counter() - t0
    tail = b""
    keep = len(_TOKEN_EVENT) - 1
    async with client.stream("POST", "/v1/completions", json=payload) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "times": [], "sent": sent}
        async for piece in r.aiter_raw():
            buf = tail + piece
            n = buf.count(_TOKEN_EVENT)
            if n:
                now = time.perf_counter() - t0
                times.extend([now] * n)
            # the marker has no suffix that is also its prefix, so keeping the last
            # len - 1 bytes never counts one twice
            tail = buf[-keep:]
    return {"status": 200, "times": times, "sent": sent}


async def _load(port: int, streams: int, tokens: int, handle: Any, profile: Any = None
                ) -> tuple[list[dict[str, Any]], float, list[tuple[float, int]]]:
    """Run the streams; also samples the scheduler's busy-step counter (time, steps)."""
    import httpx

    limits = httpx.Limits(max_connections=streams + 10, max_keepalive_connections=streams)
    samples: list[tuple[float, int]] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600,
                                 limits=limits) as client:
        t0 = time.perf_counter()
        jobs: list[Any] = [_stream(client, i, tokens, t0) for i in range(streams)]
        if profile is not None:
            jobs.append(profile())
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                st = await handle.stats.remote()
                samples.append((time.perf_counter() - t0, int(st["steps"])))
                await asyncio.sleep(0.5)

        sampler = asyncio.ensure_future(sample())
        res = await asyncio.gather(*jobs)
        done.set()
        await sampler
        return [r for r in res if r is not None], time.perf_counter() - t0, samples


def _py_spy() -> str:
    """py-spy from PATH, else beside this interpreter (a venv not on PATH)."""
    import shutil

    found = shutil.which("py-spy")
    return found or str(Path(sys.executable).with_name("py-spy"))


def _profiler(kinds: dict[str, list[int]], out: Path, delay_s: float, duration_s: float
              ) -> Any:
    """A coroutine factory: after ``delay_s``, py-spy one process of each kind."""
    async def go() -> None:
        await asyncio.sleep(delay_s)
        out.mkdir(parents=True, exist_ok=True)
        procs = []
        targets = [(k, p[0]) for k, p in kinds.items()
                   if p and k not in ("raylet+gcs", "client")]
        if len(kinds["decode"]) > 1:  # rank 0 reports every step: also one that does not
            targets.append(("decode_last", kinds["decode"][-1]))
        for kind, pid in targets:
            cmd = [_py_spy(), "record", "--nonblocking", "--gil", "--rate", "100",
                   "--format", "raw",
                   "--duration", str(int(duration_s)), "--output", str(out / f"{kind}.txt"),
                   "--pid", str(pid)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        while any(p.poll() is None for p in procs):
            await asyncio.sleep(0.5)
    return go


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Top functions of one py-spy raw (collapsed) profile: by own samples and by
    inclusive samples (the function or anything it calls)."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1]
                  + ")" if " (" in f else f for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    share = (lambda c: round(100.0 * c / total, 1)) if total else (lambda c: 0.0)
    return {"samples": total,
            "own_pct": [(f, share(c)) for f, c in own.most_common(top)],
            "inclusive_pct": [(f, share(c)) for f, c in incl.most_common(top + 10)
                              if share(c) < 99.5][:top]}


async def _first_token(port: int) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        t0 = time.perf_counter()
        r = await _stream(client, 10**6, 20, t0)
        return r["times"][0] if r["times"] else float("nan")


def run(replicas: int, streams: int, tokens: int, step_b_s: float = 0.002,
        extra: dict[str, Any] | None = None, num_cpus: int | None = None,
        profile_dir: str | None = None, profile_s: float = 10.0) -> dict[str, Any]:
    """Deploy, measure, tear down; returns the report (see the module docstring)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, single-user cluster
    import ray
    from ray import serve

    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    port = _free_port()
    slots = max(16, -(-streams // replicas))
    args = {"serve.app_name": APP, "replicas": replicas, "slots": slots, "serve.port": port,
            "step_b_s": step_b_s, "step_a_s_per_token": 0.0,
            "pool_capacity": max(1024, 2 * streams), **(extra or {})}
    cfg = parse_graph_config(args)
    ray.init(include_dashboard=False, num_cpus=num_cpus, object_store_memory=512 * 1024**2,
             log_to_driver=False)
    try:
        t = time.perf_counter()
        handle = deploy(cfg)
        deploy_s = time.perf_counter() - t
        first = asyncio.run(_first_token(port))
        kinds = _processes(replicas)
        handle.reset_stats.remote().result()
        cpu0 = _cpu_by_kind(kinds)
        prof = (_profiler(kinds, Path(profile_dir), 3.0, profile_s) if profile_dir
                else None)
        res, wall, samples = asyncio.run(_load(port, streams, tokens, handle, prof))
        cpu1 = _cpu_by_kind(kinds)
        stats = handle.stats.remote().result()
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    ok = [r for r in res if r["status"] == 200 and len(r["times"]) == tokens]
    rates = [(tokens - 2) / (r["times"][-1] - r["times"][1]) for r in ok
             if tokens > 2 and r["times"][-1] > r["times"][1]]
    lifetime = statistics.median(rates) if rates else 0.0
    sps, window = _step_rate(ok, samples)
    steps = int(stats["steps"])
    got = sum(len(r["times"]) for r in res)
    if profile_dir:
        summary = {p.stem: summarize_profile(p) for p in sorted(Path(profile_dir).glob("*.txt"))}
        (Path(profile_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
    return {
        "config": {"replicas": replicas, "streams": streams, "tokens": tokens,
                   "slots": slots, "step_b_s": step_b_s, **(extra or {})},
        "steps_per_s": round(sps, 2), "ms_per_step": round(1e3 / sps, 2) if sps else None,
        "steps_per_s_lifetime": round(lifetime, 2), "rate_window": window,
        "streamed_tok_s": round(got / wall, 1),
        "first_token_s": round(first, 3),
        "ttft_p50_s": round(statistics.median(r["times"][0] - r["sent"] for r in ok), 3)
        if ok else None,
        "busy_steps": steps, "wall_s": round(wall, 2), "deploy_s": round(deploy_s, 1),
        "streams_ok": len(ok), "streams": streams,
        "cpu_s_per_step": {k: round((cpu1[k] - cpu0[k]) / steps, 5) if steps else None
                           for k in cpu0},
        "cpu_s_total": round(sum(cpu1[k] - cpu0[k] for k in cpu0), 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }


def _step_rate(ok: list[dict[str, Any]], samples: list[tuple[float, int]]
               ) -> tuple[float, str]:
    """Busy steps per second at the barrier: over the window in which every stream runs
    (``"all streams"``), else over the whole busy period (``"busy period"``)."""
    def slope(pts: list[tuple[float, int]]) -> float:
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else 0.0

    if ok:
        lo = max(r["times"][0] for r in ok)
        hi = min(r["times"][-1] for r in ok)
        inside = [p for p in samples if lo <= p[0] <= hi]
        if len(inside) >= 2 and inside[-1][1] > inside[0][1]:
            return slope(inside), "all streams"
    moving = [p for k, p in enumerate(samples) if k and p[1] > samples[k - 1][1]]
    start = [samples[samples.index(moving[0]) - 1]] if moving else []
    return slope(start + moving), "busy period"


def format_row(r: dict[str, Any]) -> str:
    c = r["config"]
    cpu = r["cpu_s_per_step"]
    per = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in cpu.items() if v)
    return (f"| {c['replicas']} | {c['streams']} | {r['steps_per_s']} | {r['ms_per_step']} | "
            f"{r['streamed_tok_s']:,.0f} | {r['first_token_s']} | {per} |")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=8, help="G decode replicas")
    p.add_argument("--streams", type=int, default=128, help="concurrent streams")
    p.add_argument("--tokens", type=int, default=300, help="tokens per stream")
    p.add_argument("--step-b-s", type=float, default=0.002,
                   help="emulated step time (near zero: the graph's own cost shows)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="another graph option (GraphConfig field), repeatable")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="py-spy one process of each actor kind during the load")
    p.add_argument("--profile-s", type=float, default=10.0, help="seconds to profile")


def main_args(args: argparse.Namespace) -> int:
    for name in ("replicas", "streams", "tokens"):
        if getattr(args, name) < (3 if name == "tokens" else 1):
            raise ValueError(f"--{name}: too small (got {getattr(args, name)})")
    extra: dict[str, Any] = {}
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected key=value (got {item!r})")
        extra[key] = val
    rep = run(args.replicas, args.streams, args.tokens, args.step_b_s, extra, args.num_cpus,
              args.profile, args.profile_s)
    if args.json:
        print(json.dumps(rep))
    else:
        print("| G | streams | steps/s | ms/step | streamed tok/s | first token s | "
              "CPU ms per step by actor kind |")
        print("|---|---|---|---|---|---|---|")
        print(format_row(rep))
    return 0 if rep["streams_ok"] == rep["streams"] else 1


def register(sub: Any) -> None:
    p = sub.add_parser("bench-control-plane",
                       help="per-step cost of the live graph's own protocol (near-zero "
                            "emulated step)", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=main_args)


if __name__ == "__main__":  # also runs against an older checkout (see the docstring)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main_args(parser.parse_args()))
