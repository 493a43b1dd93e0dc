"""The scheduler honours a policy's re-tick time (a bounded hold ends on time), Ray-free."""

from __future__ import annotations

import asyncio
import time

from br_serve.core import build_policy
from br_serve.core.step import StepModel
from br_serve.serve.config import parse_graph_config
from br_serve.serve.scheduler.actor import Scheduler
from br_serve.serve.scheduler.core import SchedulerCore
from tests.serve.test_sched_core import _admission


def _held_core(clock: list[float]) -> SchedulerCore:
    core = SchedulerCore(2, 2, 8, StepModel(0.0, 0.01, 0.0),
                         # an idle cluster, and a step with no load term: the hold at
                         # any load and load share (by default it holds only while half
                         # the slots run and the load is 40% of the step)
                         build_policy("br0", {"hold_budget_ms": 200.0,
                                              "hold_min_busy_share": 0.0,
                                              "hold_min_load_share": 0.0}), detail=False,
                         clock=lambda: clock[0])
    core.mark_alive(0, "i0")
    core.mark_alive(1, "i1")
    return core


def test_core_records_the_retick_time_of_a_held_request() -> None:
    clock = [0.0]
    core = _held_core(clock)
    core.submit(_admission("a", 3000))  # above every replica's peak: held
    clock[0] = 0.05
    assert core.tick() == [] and core.retick_s == 0.2
    clock[0] = 0.2  # the budget is spent: placed, and no further ask
    (d,) = core.tick()
    assert d.admission.request_id == "a" and core.retick_s is None


def test_retick_wakes_the_tick_loop_at_the_requested_time() -> None:
    async def run() -> float:
        sch = Scheduler(parse_graph_config(policy="br0",
                                           policy_options={"hold_budget_ms": 50}),
                        ["d0", "d1"])
        sch._wake = asyncio.Event()
        sch.core.retick_s = sch.core.now_s() + 0.05
        t0 = time.perf_counter()
        sch._arm_retick()
        await asyncio.wait_for(sch._wake.wait(), timeout=5.0)
        return time.perf_counter() - t0

    waited = asyncio.run(run())
    assert 0.04 <= waited < 2.0
