"""The scheduler honours a policy's re-tick time (a bounded hold ends on time), Ray-free."""

from __future__ import annotations

import asyncio
import time

from br_serve.serve.scheduler import Scheduler


def test_retick_wakes_the_tick_loop_at_the_requested_time() -> None:
    async def run() -> float:
        sch = Scheduler({"policy": "br0", "policy_options": {"hold_budget_ms": 50}},
                        ["d0", "d1"])
        sch._wake = asyncio.Event()
        t0 = time.perf_counter()
        sch._retick_at(sch._now() + 0.05)
        await asyncio.wait_for(sch._wake.wait(), timeout=5.0)
        return time.perf_counter() - t0

    waited = asyncio.run(run())
    assert 0.04 <= waited < 2.0
