"""The simulator's ranks with a FIFO queue (DyntraLB's waiting lists, plans off) give
the policy the same queued/running split as the serving mirror (no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np

from br_serve.core.policies.br0 import BR0
from br_serve.sim import parse_sim_config, simulate
from br_serve.traces import Trace

FIFO = {"bubble_threshold_blocks": 1e18, "mode": "dynamic", "long_request_blocks": 1 << 40,
        "waiting_per_rank": 2}


def test_the_policy_sees_the_ranks_queues(monkeypatch: Any) -> None:
    seen: list[tuple[list[int], list[int], list[int] | None]] = []
    orig = BR0.schedule

    def spy(self: BR0, cluster: Any, pool: Any, now_s: float, tick: int) -> Any:
        q = cluster.queued_requests
        seen.append((cluster.running_requests.tolist(), [] if q is None else q.tolist(),
                     None if cluster.engine_slots is None else cluster.engine_slots.tolist()))
        return orig(self, cluster, pool, now_s, tick)

    monkeypatch.setattr(BR0, "schedule", spy)
    rng = np.random.default_rng(1)
    n = 60
    tr = Trace.build([0.0] * n, rng.integers(10, 2000, n).tolist(),
                     rng.integers(5, 80, n).tolist())
    cfg = parse_sim_config({"replicas": 3, "slots": 2, "sim": {"saturated": True},
                            "dyntralb": FIFO, "policy": {"name": "br0"}})
    res = simulate(tr, cfg)
    assert (res.admit_step >= 0).all()
    assert seen and all(es == [2, 2, 2] for _, _, es in seen)
    # a queue forms (more bound than the engine runs) and never exceeds the places
    assert any(max(q) > 0 for _, q, _ in seen)
    assert all(0 <= qi <= r and r - qi <= 2 for run, q, _ in seen
               for r, qi in zip(run, q, strict=True))
