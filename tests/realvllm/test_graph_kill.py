"""A real vLLM decode server killed mid-run under the graph (README deployment, one
decode server per DP rank): every stream ends in bounded time, the ones on the other
server without error, the ones on the killed server with an explicit error or complete
after a re-prefill; none hangs.

Its own module, after test_graph.py: it kills ``fleet.decode2`` for the rest of the
package.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import pytest

from tests.realvllm.conftest import Fleet
from tests.realvllm.test_graph import deploy_readme

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_decode_server_killed_mid_run_ends_every_stream(fleet: Fleet,
                                                         serve_port: int) -> None:
    from ray import serve

    n, max_tokens = 6, 400  # long enough to be running when the server dies
    app = "br_kill"
    g = deploy_readme(fleet, "external-dp", serve_port, app)
    victim = fleet.decode2  # graph rank 1

    async def one(i: int) -> list[dict[str, Any]]:
        items = []
        gen = g.handle().generate_stream.remote(f"w{300 + i} w{301 + i} w{302 + i}",
                                                max_tokens=max_tokens, seed=i)
        async for item in gen:
            items.append(item)
        return items

    async def run() -> tuple[list[list[dict[str, Any]]], float, float]:
        task = asyncio.ensure_future(asyncio.gather(*(one(i) for i in range(n))))
        deadline = time.monotonic() + 120
        running = 0.0
        while time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.2)
            running = await asyncio.to_thread(victim.metric, "vllm:num_requests_running")
            if running >= 1:
                break
        assert running >= 1 and not task.done(), "no stream was running on rank 1"
        await asyncio.to_thread(victim.kill)
        t0 = time.monotonic()
        res = await asyncio.wait_for(task, 180)  # a hang fails here
        return list(res), running, time.monotonic() - t0

    try:
        results, running, drain_s = asyncio.run(run())
    finally:
        with contextlib.suppress(Exception):
            serve.delete(app)
    outcomes: Counter[str] = Counter()
    for items in results:
        err = items[-1].get("error")
        replicas = {it["replica"] for it in items if it.get("error") is None}
        assert items[-1].get("finished"), items[-1]
        if err is None:
            assert len(items) <= max_tokens
            outcomes[f"complete on {sorted(replicas)}"] += 1
        else:
            assert replicas <= {1}, (replicas, err)  # only rank 1's streams may fail
            outcomes[f"error after {len(items) - 1} tokens"] += 1
    print(f"\ndecode2 killed with {running:.0f} running; all {n} streams ended "
          f"{drain_s:.1f} s later: {dict(outcomes)}")
