"""The engine emulator's own CPU cost per decode step (core alone, and the whole server).

Two measurements, both at ``--dp-size`` ranks (default 8):

1. ``core``: :class:`~br_serve.emulator.core.LockstepCore` ``plan`` + ``apply`` in a
   tight loop with ``B`` running requests per rank, for each ``B`` of ``--batches``
   (median and minimum over ``--repeat`` rounds of ``--steps`` steps).
2. ``server``: a vLLM-protocol prefill and decode emulator, each its own process
   (``br-serve emulate-engine``), and ``B`` concurrent PD streams per rank driven from
   this process with :mod:`br_serve.remote`. The decode emulator's process CPU time
   over the run divided by its steps is its whole cost per step (HTTP, SSE, JSON, the
   step loop); ``step_loop_cpu_us`` is the step loop alone. ``period_ms`` is the
   measured wall time per step beside the modelled one (``a * load + b``).

Timings on a shared machine are noisy; compare numbers from one run. Prints JSON and
writes it to ``--out``.

    python benchmarks/emulator_cost.py --out /tmp/emulator_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from br_serve.emulator.core import LockstepCore, StepModel
from br_serve.remote.client import RemoteEngineClient
from br_serve.remote.requests import endpoint_path, vllm_decode_request


def core_cost(dp_size: int, batch: int, steps: int, repeat: int) -> dict[str, Any]:
    per_step = []
    for _ in range(repeat):
        core = LockstepCore(StepModel.uniform(dp_size, 5e-7, 0.03), slots=batch)
        for g in range(dp_size):
            for i in range(batch):
                core.admit(f"{g}-{i}", g, prompt_tokens=512, max_tokens=10**9, seed=i)
        core.apply(core.plan())
        t0 = time.perf_counter()
        for _ in range(steps):
            core.apply(core.plan())
        per_step.append((time.perf_counter() - t0) / steps)
    med, low = statistics.median(per_step), min(per_step)
    tokens = dp_size * batch
    return {"dp_size": dp_size, "batch_per_rank": batch, "us_per_step_median": med * 1e6,
            "us_per_step_min": low * 1e6, "ns_per_token_median": med / tokens * 1e9}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "br_serve.cli", "emulate-engine", *args],
                            stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"emulator exited with {proc.wait()}")
    return proc, str(json.loads(line)["urls"][0])


async def _drive(prefill: str, decode: str, dp_size: int, batch: int,
                 max_tokens: int) -> float:
    async with RemoteEngineClient() as c:
        async def one(i: int) -> None:
            body = {"model": "emulated", "prompt": " ".join(["w"] * 512),
                    "max_tokens": max_tokens}
            rid = f"b-{i}"
            pre = await c.vllm_prefill(prefill, body, rid)
            assert pre.kv_transfer_params is not None
            dbody, headers = vllm_decode_request(body, pre.kv_transfer_params, rid,
                                                 i % dp_size)
            n = 0
            async for _ in c.stream(decode + endpoint_path(False), dbody, headers):
                n += 1
            assert n >= max_tokens
        t0 = time.perf_counter()
        await asyncio.gather(*[one(i) for i in range(dp_size * batch)])
        return time.perf_counter() - t0


def server_cost(dp_size: int, batch: int, max_tokens: int, b_s: float) -> dict[str, Any]:
    procs = []
    try:
        pre, pre_url = _launch(["--protocol", "vllm", "--role", "prefill", "--port",
                                str(_free_port())])
        procs.append(pre)
        dec, dec_url = _launch(["--protocol", "vllm", "--role", "decode", "--dp-size",
                                str(dp_size), "--port", str(_free_port()), "--step-b-s",
                                str(b_s), "--step-a-s-per-token", "0"])
        procs.append(dec)
        s0 = httpx.get(dec_url + "/emulator/stats").json()
        wall = asyncio.run(_drive(pre_url, dec_url, dp_size, batch, max_tokens))
        s1 = httpx.get(dec_url + "/emulator/stats").json()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    steps = s1["steps"] - s0["steps"]
    cpu = s1["process_cpu_s"] - s0["process_cpu_s"]
    loop = s1["step_cpu_s"] - s0["step_cpu_s"]
    return {"dp_size": dp_size, "batch_per_rank": batch, "streams": dp_size * batch,
            "max_tokens": max_tokens, "modelled_step_ms": b_s * 1e3, "steps": steps,
            "wall_s": wall, "period_ms": wall / max(steps, 1) * 1e3,
            "overrun_s": s1["overrun_s"] - s0["overrun_s"],
            "server_cpu_us_per_step": cpu / max(steps, 1) * 1e6,
            "server_cpu_us_per_token": cpu / max(steps * dp_size * batch, 1) * 1e6,
            "step_loop_cpu_us_per_step": loop / max(steps, 1) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp-size", type=int, default=8)
    ap.add_argument("--batches", default="1,16,64,256", help="running requests per rank")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--server-batches", default="1,8", help="streams per rank (server)")
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--step-b-s", type=float, default=0.03)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--out", default="emulator_cost.json")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    report: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg": os.getloadavg()},
        "core": [core_cost(args.dp_size, b, args.steps, args.repeat) for b in batches],
        "server": []}
    if not args.skip_server:
        for b in (int(x) for x in args.server_batches.split(",")):
            report["server"].append(server_cost(args.dp_size, b, args.max_tokens,
                                                args.step_b_s))
    print(json.dumps(report, indent=2))
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
