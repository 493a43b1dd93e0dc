"""What vllm-router's ``power_of_two`` compares in PD mode: run it at ``--log-level info``
in front of the engine emulator (G = 4), send 40 concurrent completions and read its
``Power-of-two selection: URL=load vs URL=load`` lines.

    PYTHONPATH=. python research/vllm_router_p2c_loads.py results/peers/vllm_router_p2c_loads.json
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any

import httpx

from br_serve.bench.peers_routers import ARMS, router_command, wait_ready
from br_serve.emulator.config import EmulatorConfig
from tests.emulator.helpers import servers
from tests.serve.helpers import free_port

G, N = 4, 40


async def send_completions(url: str) -> list[int]:
    """``N`` concurrent two-stage completions through the router at ``url``: statuses."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        rs = await asyncio.gather(*(c.post("/v1/completions", json={
            "model": "emulated", "prompt": f"w{i} x y", "max_tokens": 30, "seed": i})
            for i in range(N)))
    return [r.status_code for r in rs]


def main(out: str) -> None:
    pre = EmulatorConfig("vllm", "prefill", 1, free_port())
    dec = EmulatorConfig("vllm", "decode", G, free_port(), step_a_s_per_token=(0.0,),
                         step_b_s=(0.05,), slots=4)
    arm = ARMS["vllm-router:power_of_two"]
    with servers(pre, dec) as (p, d):
        port = free_port()
        cmd = ["info" if x == "warning" else x
               for x in router_command(arm, port, p.url, d.url, G)]
        status, st, text = run_logged(cmd, port, d.url)
    lines = [ln[ln.index("Power-of-two"):] for ln in text.splitlines()
             if "Power-of-two selection" in ln]
    loads = [int(x) for ln in lines for x in re.findall(r"@\d+=(-?\d+)", ln)]
    res = {"router": "vllm-router 0.1.17", "dp_size": G, "concurrent_requests": N,
           "status": dict(Counter(status)), "selections": len(lines),
           "loads_read": len(loads), "nonzero_loads": sum(1 for x in loads if x),
           "admitted_per_rank": [len(r["admitted"]) for r in st["ranks"]],
           "sample": lines[:5]}
    print(json.dumps(res, indent=2))
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


def run_logged(cmd: list[str], port: int, decode_url: str
               ) -> tuple[list[int], dict[str, Any], str]:
    """Start the router ``cmd`` (listening on ``port``), send :func:`send_completions`
    through it, stop it: the statuses, the decode emulator's stats and the router's
    log without colour codes."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "NO_COLOR": "1"})
        try:
            wait_ready(f"http://127.0.0.1:{port}", "emulated", proc, 90)
            status = asyncio.run(send_completions(f"http://127.0.0.1:{port}"))
            st: dict[str, Any] = httpx.get(f"{decode_url}/emulator/stats").json()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        log.seek(0)
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read().decode(errors="replace"))
    return status, st, text


if __name__ == "__main__":
    main(sys.argv[1])
