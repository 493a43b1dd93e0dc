"""The simulator's ranks with a FIFO queue give the policy the same queued/running
split as the serving mirror, and with ``sim.dispatch_ahead`` the same offers as the
graph's scheduler (no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

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


def _spy_br0(monkeypatch: Any) -> list[tuple[list[int], list[int], list[int], int]]:
    """Each br0 call: (running, queued, offered places, assignments) per tick."""
    seen: list[tuple[list[int], list[int], list[int], int]] = []
    orig = BR0.schedule

    def spy(self: BR0, cluster: Any, pool: Any, now_s: float, tick: int) -> Any:
        res = orig(self, cluster, pool, now_s, tick)
        q = cluster.queued_requests
        seen.append((cluster.running_requests.tolist(), [] if q is None else q.tolist(),
                     cluster.slots.tolist(), len(res.assignments)))
        return res

    monkeypatch.setattr(BR0, "schedule", spy)
    return seen


def _window(n: int, seed: int = 1) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.build([0.0] * n, rng.integers(10, 2000, n).tolist(),
                       rng.integers(5, 80, n).tolist())


def test_dispatch_ahead_offers_places_as_the_graphs_scheduler(monkeypatch: Any) -> None:
    """``sim.dispatch_ahead``: free engine slots first (queue places hidden), then queue
    places for a backlog only; every request runs once."""
    seen = _spy_br0(monkeypatch)
    cfg = parse_sim_config({"replicas": 3, "slots": 2, "sim": {"saturated": True,
                                                               "dispatch_ahead": 2},
                            "policy": {"name": "br0"}})
    res = simulate(_window(60), cfg)
    assert (res.admit_step >= 0).all() and (res.finish_step >= res.admit_step).all()
    for run, q, offered, _ in seen:
        # (``running`` counts every bound request: a rank with fewer than its engine
        # slots bound has one free)
        engine_free = any(r < 2 for r in run)
        # with an engine slot free, no rank offers a queue place beyond its running
        assert not engine_free or all(o <= max(2, r) for o, r in zip(offered, run,
                                                                     strict=True))
        assert all(0 <= qi <= r and r - qi <= 2 for r, qi in zip(run, q, strict=True))
    assert any(max(q) > 0 for _, q, _, _ in seen)  # the backlog fills the queues


def test_dispatch_ahead_binds_a_short_window_late(monkeypatch: Any) -> None:
    """10 requests, 6 engine slots, 6 queue places: the queues take only the pool's
    requests beyond 2 per rank, so at t = 0 only the 6 engine slots are bound and the
    other 4 wait in the pool for whichever rank frees a slot first (the old model,
    every place offered at once, bound all 10 at t = 0)."""
    seen = _spy_br0(monkeypatch)
    cfg = parse_sim_config({"replicas": 3, "slots": 2, "sim": {"saturated": True,
                                                               "dispatch_ahead": 2},
                            "policy": {"name": "br0"}})
    res = simulate(_window(10), cfg)
    assert (res.admit_step >= 0).all()
    assert seen[0][3] == 6 and all(max(q) == 0 for _, q, _, _ in seen)
    assert sum(n for *_, n in seen) == 10


def test_dispatch_ahead_is_refused_beside_dyntralb_and_an_admit_delay() -> None:
    for extra in ({"dyntralb": FIFO}, {"sim": {"dispatch_ahead": 2, "admit_delay_steps": 1}}):
        over: dict[str, Any] = {"replicas": 2, "slots": 2, "sim": {"dispatch_ahead": 2}}
        over.update(extra)
        with pytest.raises(ValueError, match=r"sim\.dispatch_ahead"):
            parse_sim_config(over)
