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


def _pools_seen(monkeypatch: Any, per_delivery: bool, **options: Any
                ) -> tuple[list[tuple[float, list[str], list[str]]], Any]:
    """Five requests stamped t = 0, prefilled alike, then one at 3 s, on 4 x 2 slots:
    each br0 call's (now, pool, placed ids), and the result."""
    seen: list[tuple[float, list[str], list[str]]] = []
    orig = BR0.schedule

    def spy(self: BR0, cluster: Any, pool: Any, now_s: float, tick: int) -> Any:
        ids = [r.request_id for r in pool.fcfs()]
        res = orig(self, cluster, pool, now_s, tick)
        seen.append((now_s, ids, [a.request_id for a in res.assignments]))
        return res

    monkeypatch.setattr(BR0, "schedule", spy)
    tr = Trace.build([0.0] * 5 + [3.0], [100, 200, 300, 400, 500, 600], [4] * 6)
    cfg = parse_sim_config({"replicas": 4, "slots": 2,
                            "policy": {"name": "br0", "options": options},
                            "prefill": {"replicas": 8, "p0_s": 0.01, "p1_s_per_token": 0},
                            "sim": {"tick_per_delivery": per_delivery}})
    res = simulate(tr, cfg)
    first = list(seen)
    assert (res.admit_step >= 0).all()
    again = simulate(tr, cfg)  # same input, same result
    assert again.admit_step.tolist() == res.admit_step.tolist()
    assert again.replica.tolist() == res.replica.tolist()
    monkeypatch.setattr(BR0, "schedule", orig)
    return first, res


def test_a_clump_reaches_the_policy_at_once_or_one_request_per_tick(
        monkeypatch: Any) -> None:
    """By default one tick sees a clump together; with ``sim.tick_per_delivery`` each
    tick sees one more request, in finishing order, as the live scheduler does (each
    submit wakes its tick)."""
    batched, _ = _pools_seen(monkeypatch, False, hold_budget_ms=0)
    assert [p for _, p, _ in batched] == [["r0", "r1", "r2", "r3", "r4"], ["r5"]]
    single, _ = _pools_seen(monkeypatch, True, hold_budget_ms=0)
    assert [p for _, p, _ in single] == [["r0"], ["r1"], ["r2"], ["r3"], ["r4"], ["r5"]]


def test_one_at_a_time_the_clumps_last_and_largest_request_is_held(
        monkeypatch: Any) -> None:
    """Why it matters (docs/simulator.md): placed together, the clump's largest request
    goes first and nothing is held; arriving last and alone, it finds the ranks half
    busy and balanced, is above every peak, and the bounded hold keeps it until a
    finish opens a margin."""
    # prompts of 100-600 tokens are a sliver of the default step: the hold acts at
    # any load share here (the gate is tested in tests/core/test_shallow_trust.py)
    batched, _ = _pools_seen(monkeypatch, False, hold_min_load_share=0.0)
    assert batched[0][2] == ["r4", "r3", "r2", "r1", "r0"]
    single, res = _pools_seen(monkeypatch, True, hold_min_load_share=0.0)
    held = [(t, placed) for t, p, placed in single if p == ["r4"]]
    assert held[0][0] == pytest.approx(0.01) and held[0][1] == []  # alone and held
    assert held[-1][1] == ["r4"] and held[-1][0] > 0.01  # placed once a finish came
    assert res.admit_step[4] > res.admit_step[:4].max()
