"""The shallow-pool mode (placement, bounded hold) and BR-H's per-tick trust rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import (
    ClusterSnapshot,
    OracleHook,
    PolicyContext,
    PoolRequest,
    PromptPool,
    RunningRequests,
    build_policy,
)
from br_serve.core.shares import load_share
from tests.core.strategies import states


def _pool(sizes: list[int], enqueued_s: float = 0.0) -> PromptPool:
    pool = PromptPool()
    for i, s in enumerate(sizes):
        pool.add(PoolRequest(f"r{i}", s, enqueued_s=enqueued_s))
    return pool


def test_shallow_pool_goes_to_least_loaded_replica_that_fits() -> None:
    # Three replicas (loads 5,000 / 2,000 / 3,000), free slots 3 / 1 / 1, one request
    # of 500: it fits everywhere (F = 500), so the least loaded replica takes it. The
    # replica loop of the stages would have sent it to the one with most free slots.
    cluster = ClusterSnapshot.build([5000, 2000, 3000], [1, 3, 3], 4)
    res = build_policy("br0").schedule(cluster, _pool([500]), 0.0, 0)
    assert [(a.request_id, a.replica) for a in res.assignments] == [("r0", 1)]
    assert res.shallow == 1
    deep = build_policy("br0", {"shallow_pool": False}).schedule(cluster, _pool([500]), 0.0, 0)
    assert deep.assignments[0].replica == 0


def test_shallow_pool_places_largest_first() -> None:
    # Margins 3,000 (replica 1) and 0: the 2,500 goes first and takes replica 1; the
    # 100 still fits the 500 left there. FCFS order would have sent the 100 to
    # replica 1 first and the 2,500 would then have overflowed everywhere.
    cluster = ClusterSnapshot.build([4000, 1000], [1, 1], 3)
    res = build_policy("br0").schedule(cluster, _pool([100, 2500]), 0.0, 0)
    assert [(a.request_id, a.replica) for a in res.assignments] == [("r1", 1), ("r0", 1)]


def test_hold_waits_for_a_better_placement_within_its_budget() -> None:
    # Loads equal: a 3,000-token prompt overflows both replicas. With a 200 ms budget it
    # is held (retick when its budget ends); once the budget is spent it is placed.
    # (Clusters here have no fixed step cost, b = 0: the load is the whole step, so
    # the load-share gate, tested on its own below, lets the hold act.)
    cluster = ClusterSnapshot.build([1000, 1000], [1, 1], 2, step_b_s=0.0)
    pol = build_policy("br0", {"hold_budget_ms": 200.0})
    pool = _pool([3000], enqueued_s=10.0)
    held = pol.schedule(cluster, pool, 10.05, 0)
    assert held.assignments == () and held.held == 1
    assert held.retick_s == pytest.approx(10.2)
    late = pol.schedule(cluster, pool, 10.2, 1)
    assert len(late.assignments) == 1 and late.held == 0 and late.retick_s is None
    # A prompt that fits some margin is never held.
    fits = pol.schedule(ClusterSnapshot.build([4000, 1000], [1, 1], 2, step_b_s=0.0),
                        pool, 10.05, 0)
    assert len(fits.assignments) == 1 and fits.held == 0


@pytest.mark.parametrize("name", ["br0", "brh"])
def test_the_default_hold_waits_only_while_half_the_slots_run(name: str) -> None:
    # Loads equal: the 3,000-token prompt overflows both replicas. The default hold (2 s)
    # keeps it back while at least half the alive slots run, and places it at once in a
    # lighter cluster, where the step time it would buy is not scarce (a dead replica's
    # slots do not count).
    pool = _pool([3000], enqueued_s=10.0)
    base: dict[str, object] = {"horizon": 6} if name == "brh" else {}
    pol = build_policy(name, base)
    half = ClusterSnapshot.build([1000, 1000], [2, 2], 4, step_b_s=0.0)  # 4 of 8 slots run
    light = ClusterSnapshot.build([1000, 1000], [1, 1], 4, step_b_s=0.0)  # 2 of 8
    dead = ClusterSnapshot.build([1000, 1000, 0, 0], [2, 2, 0, 0], 4, step_b_s=0.0,
                                 alive=np.array([True, True, False, False]))
    for busy in (half, dead):
        res = pol.schedule(busy, pool, 10.05, 0)
        assert res.held == 1 and res.assignments == ()
        assert res.retick_s == pytest.approx(12.0)
    res = pol.schedule(light, pool, 10.05, 0)
    assert res.held == 0 and len(res.assignments) == 1
    always = build_policy(name, {**base, "hold_min_busy_share": 0.0})
    assert always.schedule(light, pool, 10.05, 0).held == 1


@pytest.mark.parametrize("name", ["br0", "brh"])
def test_a_kv_bound_cluster_counts_as_busy_for_the_hold(name: str) -> None:
    # 2 of 8 slots run, but the replicas' KV is 5,000 of 6,000 tokens full each (83%):
    # a KV-bound rank runs fewer requests than it has slots, and it is as busy as a
    # full one. The 500-token prompt overflows both (equal loads) and fits their KV
    # room, so the default hold keeps it back; without KV limits the same cluster is
    # light and the prompt is placed at once.
    pool = _pool([500], enqueued_s=10.0)
    pol = build_policy(name, {"horizon": 6} if name == "brh" else {})
    kv_bound = ClusterSnapshot.build([5000, 5000], [1, 1], 4, kv_limit_tokens=6000,
                                     step_b_s=0.0)
    res = pol.schedule(kv_bound, pool, 10.05, 0)
    assert res.held == 1 and res.assignments == ()
    unlimited = ClusterSnapshot.build([5000, 5000], [1, 1], 4, step_b_s=0.0)
    res = pol.schedule(unlimited, pool, 10.05, 0)
    assert res.held == 0 and len(res.assignments) == 1
    # under half full (2,000 of 6,000 each, 33%) the KV does not make it busy either
    roomy = ClusterSnapshot.build([2000, 2000], [1, 1], 4, kv_limit_tokens=6000,
                                  step_b_s=0.0)
    assert pol.schedule(roomy, pool, 10.05, 0).held == 0


@pytest.mark.parametrize("name", ["br0", "brh"])
def test_the_default_hold_waits_only_where_the_load_is_most_of_the_step(name: str) -> None:
    # Half the slots run and the loads are equal, so the prompt overflows both replicas
    # and the busy share lets the hold act. With the default step (a = 5e-7 s/token,
    # b = 0.03 s) the load share is a L / (a L + b): 40,000 tokens a replica make it
    # 0.4, the default floor. At 50,000 (0.45) the prompt is held; at 30,000 (0.33) the
    # fixed cost dominates, balance barely moves the step, and it is placed at once.
    pool = _pool([3000], enqueued_s=10.0)
    base: dict[str, object] = {"horizon": 6} if name == "brh" else {}
    pol = build_policy(name, base)
    heavy = ClusterSnapshot.build([50_000, 50_000], [2, 2], 4)
    light = ClusterSnapshot.build([30_000, 30_000], [2, 2], 4)
    assert load_share(heavy) == pytest.approx(0.025 / 0.055)
    assert load_share(light) == pytest.approx(0.015 / 0.045)
    res = pol.schedule(heavy, pool, 10.05, 0)
    assert res.held == 1 and res.assignments == ()
    res = pol.schedule(light, pool, 10.05, 0)
    assert res.held == 0 and len(res.assignments) == 1
    # the share is the barrier replica's: a dead replica's load does not count
    dead = ClusterSnapshot.build([30_000, 30_000, 90_000], [2, 2, 0], 4,
                                 alive=np.array([True, True, False]))
    assert load_share(dead) == pytest.approx(load_share(light))
    always = build_policy(name, {**base, "hold_min_load_share": 0.0})
    assert always.schedule(light, pool, 10.05, 0).held == 1


@settings(max_examples=120, deadline=None)
@given(st_=states(kv=True, dead=True), budget_ms=st.sampled_from([1.0, 50.0, 1000.0]),
       now=st.floats(0.0, 2.0), spread=st.floats(0.0, 2.0), name=st.sampled_from(
           ["br0", "brh"]))
def test_hold_never_exceeds_its_budget(st_: tuple[ClusterSnapshot, PromptPool],
                                       budget_ms: float, now: float, spread: float,
                                       name: str) -> None:
    cluster, pool = st_
    # re-date the pool: entries spread over [now - spread, now]
    dated = PromptPool(max(len(pool), 1))
    rng = np.random.default_rng(len(pool))
    for rid, size in zip(pool.sorted_ids, pool.sorted_sizes, strict=True):
        dated.add(PoolRequest(rid, size, enqueued_s=now - spread * float(rng.random())))
    opts: dict[str, object] = {"hold_budget_ms": budget_ms}
    if name == "brh":
        opts["horizon"] = 6
    res = build_policy(name, opts).schedule(cluster, dated, now, 0)
    budget = budget_ms / 1e3
    placed = {a.request_id for a in res.assignments}
    waiting = [dated.get(r) for r in dated.sorted_ids if r not in placed]
    if res.held:
        assert res.retick_s is not None and now < res.retick_s <= now + budget + 1e-9
        # the hint is the end of some waiting request's budget
        assert any(abs(r.enqueued_s + budget - res.retick_s) < 1e-9 for r in waiting)
    else:
        assert res.retick_s is None
    # holding only happens in a pool that fits the free slots, and only to requests
    # whose budget has not run out: at most that many are held
    assert res.held <= sum(1 for r in waiting if now < r.enqueued_s + budget)


@settings(max_examples=150, deadline=None)
@given(st_=states(max_g=10, kv=True, dead=True), s_greedy=st.integers(0, 12),
       r_max=st.integers(1, 5), shallow=st.booleans(),
       hold=st.sampled_from([0.0, 100.0]), fcfs=st.sampled_from([None, 0.0, 30.0]),
       soft=st.sampled_from([0.0, 0.25, 1.0]), factor=st.sampled_from([1.0, 2.0]),
       decode=st.sampled_from([None, 0.0, 0.5]),
       step=st.sampled_from([None, 1, 25]))
def test_brh_h0_equals_br0_with_the_new_options(
        st_: tuple[ClusterSnapshot, PromptPool], s_greedy: int, r_max: int, shallow: bool,
        hold: float, fcfs: float | None, soft: float, factor: float,
        decode: float | None, step: int | None) -> None:
    """``horizon=0, alpha=1, beta=G`` is BR-0 under every ageing (slack, factor, lead
    time), shallow-pool, hold and trust setting (the options BR-H shares with BR-0 set
    alike), over a few ticks so the ageing clock matters."""
    cluster, pool = st_
    g_alive = int(cluster.alive.sum())
    common: dict[str, object] = {
        "s_greedy": s_greedy, "r_max": r_max, "shallow_pool": shallow,
        "hold_budget_ms": hold, "max_wait_beyond_fcfs_s": fcfs, "ageing_soft_share": soft,
        "fcfs_wait_factor": factor}
    br0 = build_policy("br0", common)
    brh = build_policy("brh", {"horizon": 0, "alpha": 1.0, "beta": float(g_alive),
                               "trust_decode_share": decode, "horizon_step": step, **common},
                       PolicyContext(predictor=OracleHook(), clock=lambda: 0.0))
    pa, pb = PromptPool(), PromptPool()
    for rid, size in zip(pool.sorted_ids, pool.sorted_sizes, strict=True):
        pa.add(PoolRequest(rid, size))
        pb.add(PoolRequest(rid, size))
    snap = cluster
    if len(snap.running):  # the oracle needs true remaining steps; give some
        run = snap.running
        snap = ClusterSnapshot.build(
            snap.load_tokens, snap.running_requests, snap.slots, snap.kv_limit_tokens,
            snap.alive, running=RunningRequests.build(
                run.replica, run.prompt_tokens, run.decoded_tokens,
                true_remaining_steps=np.arange(len(run)) % 3 + 1))
    for tick in range(3):
        now = 20.0 * tick
        a = br0.schedule(snap, pa, now, tick)
        b = brh.schedule(snap, pb, now, tick)
        assert a.assignments == b.assignments
        assert (a.held, a.retick_s) == (b.held, b.retick_s)
        pa.remove_many(a.assignments)
        pb.remove_many(b.assignments)


def _decode_cluster(decoded: int) -> ClusterSnapshot:
    # Replica 0's request (prompt 100) ends in 3 steps (oracle); replica 1's lives on.
    run = RunningRequests.build([0, 1], [100, 100], [decoded, decoded],
                                true_remaining_steps=[3, 10_000])
    return ClusterSnapshot.build([100 + decoded] * 2, [1, 1], 3, running=run)


def test_decode_led_by_hand() -> None:
    pol = build_policy("brh", {"trust_decode_share": 0.5},
                       PolicyContext(predictor=OracleHook(), clock=lambda: 0.0))
    assert pol.decode_led(_decode_cluster(100))  # type: ignore[attr-defined]  # 100 / 200
    assert not pol.decode_led(_decode_cluster(99))  # type: ignore[attr-defined]
    off = build_policy("brh", {"trust_decode_share": None},
                       PolicyContext(predictor=OracleHook(), clock=lambda: 0.0))
    assert off.decode_led(_decode_cluster(0))  # type: ignore[attr-defined]
    empty = ClusterSnapshot.build([0, 0], [0, 0], 3, running=RunningRequests.empty())
    assert not pol.decode_led(empty)  # type: ignore[attr-defined]


def test_decode_rule_looks_ahead_only_where_decode_makes_the_load() -> None:
    """A deep pool: where prompts make the load the tick is BR-0's, predictor unasked;
    where decode does, it looks ahead (and here sees replica 0's coming drop)."""
    opts = {"horizon": 40, "horizon_step": 5, "shallow_pool": False,
            "trust_decode_share": 0.5}
    pool_sizes = [400, 900, 1500, 3000]
    asked: list[int] = []

    class Counting(OracleHook):
        def predict(self, running: RunningRequests, horizon_steps: int):  # type: ignore[no-untyped-def]
            asked.append(horizon_steps)
            return super().predict(running, horizon_steps)

    prompt_led = build_policy("brh", opts, PolicyContext(predictor=Counting()))
    res = prompt_led.schedule(_decode_cluster(50), _pool(pool_sizes), 0.0, 0)
    assert not res.lookahead and asked == []
    br0 = build_policy("br0", {"shallow_pool": False}).schedule(
        _decode_cluster(50), _pool(pool_sizes), 0.0, 0)
    assert res.assignments == br0.assignments
    decode_led = build_policy("brh", opts, PolicyContext(predictor=Counting()))
    res = decode_led.schedule(_decode_cluster(5000), _pool(pool_sizes), 0.0, 0)
    assert res.lookahead and asked == [40]


@settings(max_examples=150, deadline=None)
@given(st_=states(max_g=8, kv=True, dead=True), share=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
       step=st.sampled_from([None, 5, 25]), h=st.sampled_from([40, 800]))
def test_a_tick_not_led_by_decode_is_br0s(
        st_: tuple[ClusterSnapshot, PromptPool], share: float, step: int | None,
        h: int) -> None:
    """Where decode is below the share of the running load, at any pool depth, BR-H
    makes exactly BR-0's assignments and reports no look-ahead; where decode leads, it
    looks ahead (whatever it then assigns: the decode rule's only companion here,
    the coverage rule, is off)."""
    cluster, pool = st_
    opts = {"horizon": h, "horizon_step": step, "trust_decode_share": share}
    brh = build_policy("brh", opts, PolicyContext(predictor=OracleHook(), clock=lambda: 0.0))
    run = cluster.running
    snap = ClusterSnapshot.build(  # the oracle needs true remaining steps
        cluster.load_tokens, cluster.running_requests, cluster.slots,
        cluster.kv_limit_tokens, cluster.alive, running=RunningRequests.build(
            run.replica, run.prompt_tokens, run.decoded_tokens,
            true_remaining_steps=np.arange(len(run)) * 37 % 900 + 1))
    res = brh.schedule(snap, pool, 0.0, 0)
    led = brh.decode_led(snap)  # type: ignore[attr-defined]
    assert res.lookahead == led  # a shallow pool included
    if not led:
        assert res.assignments == build_policy("br0").schedule(snap, pool, 0.0, 0).assignments
