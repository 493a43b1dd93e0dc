"""DecodeReplica's step loop against a fake barrier and scheduler (no Ray): what the
barrier carries and what the replica reports.

Why it matters: the scheduler prices every step and computes the imbalance from the
barrier rows. They must be the loads the step computed with; the post-step state
(finished requests gone, survivors one token longer) would under-price the step and
under-count its tokens.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from br_serve.engine.base import SamplingParams
from br_serve.serve.config import parse_graph_config
from br_serve.serve.replica.decode import DecodeReplica
from br_serve.serve.wire.messages import Admission, ReplicaReport
from br_serve.transport.base import KVHandle
from tests.serve.helpers import RecordingTransport, fake_lease

KV_BYTES_PER_TOKEN = 4
FATAL: list[str] = []


def _fail() -> None:
    FATAL.append("step thread failed")  # (checked after the test; never exit pytest)


class FakeBarrier:
    """A one-member group: records what each step exchanged."""

    generation = 1
    members = (0,)
    rank = 0

    def __init__(self) -> None:
        self.rows: list[tuple[int, int]] = []
        self.compute_s: list[float] = []
        self.steps = 0

    def exchange(self, load_tokens: int, running: int, reports: int = 0,
                 compute_s: float = 0.0) -> np.ndarray:
        self.rows.append((int(load_tokens), int(running)))
        self.compute_s.append(compute_s)
        self.steps += 1
        return np.array([[load_tokens, running, reports, compute_s]], dtype=np.float64)

    def close(self) -> None:
        return None


@pytest.fixture(params=[{}, {"cost": "time"}], ids=["tokens", "time"])
def replica(request: pytest.FixtureRequest
            ) -> Iterator[tuple[DecodeReplica, FakeBarrier, list[ReplicaReport]]]:
    rep = DecodeReplica(0, parse_graph_config(slots=4, step_b_s=0.005,
                                              engine_kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                                              policy_options=request.param),
                        "no-scheduler")
    rep.on_fatal = _fail
    rep.lease, _ = fake_lease(RecordingTransport())
    reports: list[ReplicaReport] = []
    lock = threading.Lock()

    def tell(method: str, *args: Any) -> bool:
        if method == "report":
            with lock:
                reports.append(args[0])
        return True

    rep._tell_scheduler = tell  # type: ignore[method-assign]
    yield rep, FakeBarrier(), reports
    asyncio.run(rep.shutdown())
    rep._thread.join(5)


def _admission(rid: str, prompt_tokens: int, max_tokens: int) -> Admission:
    kv = KVHandle("fake", rid, prompt_tokens * KV_BYTES_PER_TOKEN)
    return Admission(rid, "ingress-x", prompt_tokens, 7, SamplingParams(max_tokens=max_tokens),
                     kv)


def test_barrier_carries_the_loads_the_step_computed_with(
        replica: tuple[DecodeReplica, FakeBarrier, list[ReplicaReport]]) -> None:
    rep, barrier, reports = replica

    async def admit() -> None:
        # max_tokens=2: one decode step each (token 0 came from prefill), so both
        # finish in the first step; "c" runs two steps
        for rid, p, m in (("a", 5, 2), ("b", 9, 2), ("c", 100, 3)):
            assert await rep.admit(_admission(rid, p, m))

    asyncio.run(admit())
    rep._loop = None  # that loop is closed: no poll wake-ups to deliver
    with rep._lock:  # start stepping only now, so all three start in the same step
        rep._barrier = barrier  # type: ignore[assignment]
        rep._wake_step.notify_all()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len([r for r in reports if r.finished_ids]) < 2:
        time.sleep(0.01)
    busy = [r for r in reports if sum(r.barrier_running)]
    assert len(busy) == 2
    # step 1: all three, loads = prompts; step 2: "c" alone, one token longer
    assert barrier.rows[:2] == [(5 + 9 + 100, 3), (101, 1)]
    assert busy[0].barrier_loads == (114,) and busy[0].barrier_running == (3,)
    # the report's own state is after the step: a and b gone, c one token longer
    assert busy[0].running_ids == ("c",) and busy[0].load_tokens == 101
    assert sorted(busy[0].finished_ids) == ["a", "b"]
    assert busy[1].barrier_loads == (101,) and busy[1].running_ids == ()
    assert [r.barrier_step for r in busy] == [1, 2]
    # each step's own compute time (the engine sleeps its modelled 5 ms; the barrier
    # wait is not in it); rank 0's report carries it only for a calibrating policy
    assert all(0.004 < t < 1.0 for t in barrier.compute_s[:2])
    if rep.cfg.policy.needs().calibrated_step_costs:
        assert [r.barrier_compute_s for r in busy] == [(t,) for t in barrier.compute_s[:2]]
        assert busy[0].barrier_compute_s[0] == busy[0].compute_s
    else:
        assert [r.barrier_compute_s for r in busy] == [(), ()]
    assert not FATAL


def test_each_decode_replica_emulates_its_own_step_coefficients() -> None:
    """Per-replica ``step.*`` lists (a heterogeneous cluster) reach each replica's
    emulated engine through the config the graph hands its actors (pickled by Ray)."""
    import pickle

    a, b, c = (5e-7, 5e-7, 7.5e-7), (0.03, 0.03, 0.045), (0.0, 0.0, 1e-3)
    conf = pickle.loads(pickle.dumps(parse_graph_config(
        replicas=3, step_a_s_per_token="5e-7,5e-7,7.5e-7", step_b_s="0.03,0.03,0.045",
        step_c_s_per_request=list(c), engine_slowdown=2,
        engine_kv_bytes_per_token=KV_BYTES_PER_TOKEN)))
    for g in range(3):
        rep = DecodeReplica(g, conf, "no-scheduler")
        try:
            eng: Any = rep.engine
            assert eng.step_time_s() == pytest.approx(2 * b[g])  # empty: b alone
            eng.admit("x", np.zeros(1000 * KV_BYTES_PER_TOKEN, np.uint8), 1000, 7,
                      SamplingParams(max_tokens=5))
            assert eng.step_time_s() == pytest.approx(2 * (a[g] * 1000 + c[g] + b[g]))
        finally:
            asyncio.run(rep.shutdown())
            rep._thread.join(5)


def test_a_hidden_emulated_slowdown_reaches_only_its_replica() -> None:
    """``engine.step_factor`` slows replica 1's engine; the configured model (what
    the scheduler is told) stays as given."""
    cfg = parse_graph_config(replicas=2, step_b_s=0.03, engine_step_factor="1,2")
    assert cfg.step_model().b_s == (0.03, 0.03)
    assert cfg.router_step_model().b_s == (0.03, 0.03)
    for g, want in ((0, 0.03), (1, 0.06)):
        rep = DecodeReplica(g, cfg, "no-scheduler")
        try:
            assert rep.engine.step_time_s() == pytest.approx(want)  # type: ignore[attr-defined]
        finally:
            asyncio.run(rep.shutdown())
            rep._thread.join(5)
