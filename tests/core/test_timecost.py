"""Time-aware BR-0: the score against the time imbalance by brute force, the
homogeneous identity with token BR-0, and hand-checked heterogeneous decisions."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import ClusterSnapshot, PoolRequest, PromptPool, build_policy
from br_serve.core.policies.br0 import ScalarMargins
from br_serve.core.tick import run_two_stage
from br_serve.core.timecost import (
    TimeMargins,
    balanced_step_s,
    homogeneous_tokens,
    stragglers_to_idle,
)
from tests.core.strategies import states

#: these hands test where the time-aware stage places; the bounded hold (on by default
#: in a busy cluster) would keep some of their lone requests back: off by name
NO_HOLD: dict[str, object] = {"hold_budget_ms": 0.0}


def _time_imbalance(t: np.ndarray) -> float:
    """``G max(t) - sum(t)``: replica-seconds idle at the barrier (the definition)."""
    return float(t.shape[0] * t.max() - t.sum())


@settings(max_examples=300, deadline=None)
@given(loads=st.lists(st.integers(0, 2 * 10**5), min_size=1, max_size=12),
       data=st.data())
def test_time_score_is_minus_delta_time_imbalance(loads: list[int],
                                                  data: st.DataObject) -> None:
    g = len(loads)
    a = np.array(data.draw(st.lists(st.floats(1e-7, 4e-6), min_size=g, max_size=g)))
    b = np.array(data.draw(st.lists(st.floats(0.0, 0.05), min_size=g, max_size=g)))
    c = np.array(data.draw(st.lists(st.floats(0.0, 3e-3), min_size=g, max_size=g)))
    run = np.array(data.draw(st.lists(st.integers(0, 16), min_size=g, max_size=g)))
    snap = ClusterSnapshot.build(loads, run, 16, step_a_s_per_token=a, step_b_s=b,
                                 step_c_s_per_request=c)
    r = data.draw(st.integers(0, g - 1))
    d = data.draw(st.integers(0, 10**5))
    n = data.draw(st.integers(1, 4))
    t = a * np.asarray(loads) + c * run + b
    after = t.copy()
    after[r] += a[r] * d + c[r] * n
    want = -(_time_imbalance(after) - _time_imbalance(t))
    got = TimeMargins(snap).scorer(r)(float(d), n)
    assert np.isclose(got, want, rtol=1e-9, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(st_=states(max_g=10, kv=True, dead=True), scale=st.sampled_from([0.25, 1.0, 2.0]),
       s_greedy=st.integers(0, 12), r_max=st.integers(1, 5))
def test_time_model_makes_token_decisions_when_replicas_are_equal(
        st_: tuple[ClusterSnapshot, PromptPool], scale: float, s_greedy: int,
        r_max: int) -> None:
    """Equal a, b and c = 0: the time objective is the token one times a. Run the time
    model itself (not the reduction to tokens) with an exactly representable a."""
    cluster, pool = st_
    snap = dataclasses.replace(cluster, step_a_s_per_token=np.full(cluster.num_replicas,
                                                                   scale),
                               step_b_s=np.zeros(cluster.num_replicas))
    args = dict(s_greedy=s_greedy, r_max=r_max)
    tok = run_two_stage(snap, pool, ScalarMargins(snap), **args)  # type: ignore[arg-type]
    tim = run_two_stage(snap, pool, TimeMargins(snap), **args)  # type: ignore[arg-type]
    assert tok.assignments == tim.assignments


@settings(max_examples=100, deadline=None)
@given(st_=states(max_g=10, kv=True, dead=True))
def test_br0_time_equals_br0_tokens_on_a_homogeneous_cluster(
        st_: tuple[ClusterSnapshot, PromptPool]) -> None:
    cluster, pool = st_
    assert homogeneous_tokens(cluster)  # default coefficients: a=5e-7, b=0.03, c=0
    tokens = build_policy("br0", NO_HOLD).schedule(cluster, pool, 0.0, 0)
    time = build_policy("br0", NO_HOLD | {"cost": "time"}).schedule(cluster, pool, 0.0, 0)
    assert tokens.assignments == time.assignments


def _pool(sizes: list[int]) -> PromptPool:
    pool = PromptPool()
    for i, s in enumerate(sizes):
        pool.add(PoolRequest(f"p{i}", s))
    return pool


def test_a_slow_replica_gets_less_of_the_same_load() -> None:
    # Equal loads (40k tokens), replica 0 prices a token twice as high: it is the
    # straggler already, so time-aware BR-0 sends the prompt to replica 1; token
    # BR-0 sees equal margins and takes the first.
    snap = ClusterSnapshot.build([40_000, 40_000], [15, 15], 16,
                                 step_a_s_per_token=[1e-6, 5e-7], step_b_s=0.03)
    pool = _pool([3000])
    assert build_policy("br0", NO_HOLD).schedule(snap, pool, 0.0, 0).assignments[0].replica == 0
    res = build_policy("br0", NO_HOLD | {"cost": "time"}).schedule(snap, pool, 0.0, 0)
    assert res.assignments[0].replica == 1


def test_batch_term_counts_requests_not_only_tokens() -> None:
    # Equal tokens; replica 0 runs 15 requests, replica 1 runs 5, c = 2 ms a request:
    # replica 0's steps are 20 ms longer, so a new request belongs on replica 1.
    snap = ClusterSnapshot.build([30_000, 30_000], [15, 5], 16, step_a_s_per_token=5e-7,
                                 step_b_s=0.03, step_c_s_per_request=0.002)
    res = build_policy("br0", NO_HOLD | {"cost": "time"}).schedule(snap, _pool([500]), 0.0, 0)
    assert res.assignments[0].replica == 1


def test_time_peak_is_the_prompt_that_fills_the_margin() -> None:
    # t = (0.051, 0.041) s: replica 1's margin is 10 ms; a new request costs c = 1 ms
    # plus 1 us a token, so 9,000 prompt tokens fill it exactly (x = m, F = m).
    snap = ClusterSnapshot.build([20_000, 10_000], [1, 1], 4, step_a_s_per_token=1e-6,
                                 step_b_s=0.03, step_c_s_per_request=0.001)
    sc = TimeMargins(snap).scorer(1)
    assert np.isclose(sc.peak, 9000.0)
    assert np.isclose(sc(9000.0), 0.01)
    assert np.isclose(sc(10_000.0), 0.011 - 2 * 0.001)  # 1 ms over: -(G-1) slope


@settings(max_examples=300, deadline=None)
@given(data=st.data(), g=st.integers(1, 10))
def test_balanced_step_time_solves_the_water_filling(data: st.DataObject, g: int) -> None:
    """``T*`` puts exactly the cluster's load on the replicas whose fixed cost is below
    it: ``sum_g max(0, (T* - f_g) / a_g) = sum_g L_g``."""
    loads = np.array(data.draw(st.lists(st.integers(0, 2 * 10**5), min_size=g, max_size=g)))
    a = np.array(data.draw(st.lists(st.floats(1e-7, 4e-6), min_size=g, max_size=g)))
    b = np.array(data.draw(st.lists(st.floats(0.0, 0.05), min_size=g, max_size=g)))
    c = np.array(data.draw(st.lists(st.floats(0.0, 3e-3), min_size=g, max_size=g)))
    run = np.array(data.draw(st.lists(st.integers(0, 16), min_size=g, max_size=g)))
    snap = ClusterSnapshot.build(loads.tolist(), run, 16, step_a_s_per_token=a,
                                 step_b_s=b, step_c_s_per_request=c)
    t_star = balanced_step_s(snap)
    f = b + c * run
    placed = np.maximum(0.0, (t_star - f) / a).sum()
    assert np.isclose(placed, loads.sum(), rtol=1e-9, atol=1e-6)
    assert t_star >= f.min() - 1e-12
    # someone is at or below T* (the weighted mean), so never every replica is idled
    t = a * loads + c * run + b
    assert (t <= t_star * (1 + 1e-9) + 1e-12).any()
    assert len(stragglers_to_idle(snap, 0.0)) < g


def test_balanced_step_time_is_the_mean_on_equal_replicas() -> None:
    snap = ClusterSnapshot.build([10_000, 30_000, 50_000], [4, 4, 4], 16)
    t = 5e-7 * np.array([10_000, 30_000, 50_000]) + 0.03
    assert np.isclose(balanced_step_s(snap), t.mean())


def test_a_replica_with_free_tokens_caps_the_balanced_time_at_its_fixed_cost() -> None:
    # Replica 0 alone would take 100 tokens at (100 + 10) / 1000 = 110 ms, past replica
    # 1's fixed 20 ms; replica 1 (a = 0, e.g. a fit clipped at 0) absorbs any load there.
    snap = ClusterSnapshot.build([100, 0], [0, 0], 4, step_a_s_per_token=[1e-3, 0.0],
                                 step_b_s=[0.01, 0.02])
    assert np.isclose(balanced_step_s(snap), 0.02)


def test_a_replica_past_the_balanced_time_waits_and_the_rest_fill() -> None:
    # Replica 1 prices a token 2x and a step 1.5x: at 40k tokens its step is 85 ms,
    # replica 0's at 80k tokens 70 ms; the balanced time of their 120k tokens is 75 ms
    # (2e6 (T - 0.03) + 1e6 (T - 0.045) = 120k). 85 > 1.1 x 75, and its fixed 45 ms is
    # under replica 0's 70: with the rule replica 1 gets nothing although it has free
    # slots; without it, BR-0 fills both.
    snap = ClusterSnapshot.build([80_000, 40_000], [8, 8], 16,
                                 step_a_s_per_token=[5e-7, 1e-6], step_b_s=[0.03, 0.045])
    assert np.isclose(balanced_step_s(snap), 0.075)
    assert stragglers_to_idle(snap, 0.1) == {1}
    assert stragglers_to_idle(snap, 0.2) == set()  # 85 ms is within 1.2 x 75
    pool = _pool([100] * 12)
    on = build_policy("br0", NO_HOLD | {"cost": "time", "idle_over_balanced": 0.1,
                              "straggler_prompt_quantile": None})
    got = on.schedule(snap, pool, 0.0, 0).assignments
    assert len(got) == 8 and {x.replica for x in got} == {0}
    assert build_policy("br0", NO_HOLD | {"cost": "time"}).options.idle_over_balanced == 0.25
    off = build_policy("br0", NO_HOLD | {"cost": "time", "idle_over_balanced": None}).schedule(
        snap, pool, 0.0, 0).assignments
    assert len(off) == 12 and {x.replica for x in off} == {0, 1}


@settings(max_examples=100, deadline=None)
@given(st_=states(max_g=10, kv=True, dead=True))
def test_idle_rule_keeps_the_homogeneous_identity_and_never_idles_the_dead(
        st_: tuple[ClusterSnapshot, PromptPool]) -> None:
    cluster, pool = st_
    tokens = build_policy("br0", NO_HOLD).schedule(cluster, pool, 0.0, 0)
    time = build_policy("br0", NO_HOLD | {"cost": "time", "idle_over_balanced": 0.0}).schedule(
        cluster, pool, 0.0, 0)
    assert tokens.assignments == time.assignments
    slow = dataclasses.replace(
        cluster, step_a_s_per_token=np.linspace(5e-7, 1e-6, cluster.num_replicas))
    assert all(cluster.alive[g] for g in stragglers_to_idle(slow, 0.0))


def test_never_idled_an_empty_replica_or_one_whose_fixed_cost_tops_the_bound() -> None:
    # Empty cluster: nothing runs, so nothing is idled; four requests fill both.
    empty = ClusterSnapshot.build([0, 0], [0, 0], 2, step_a_s_per_token=[1e-3, 2e-3],
                                  step_b_s=[0.01, 0.02])
    assert stragglers_to_idle(empty, 0.1) == set()
    got = build_policy("br0", NO_HOLD | {"cost": "time"}).schedule(empty, _pool([10] * 4), 0.0, 0)
    assert sorted(x.replica for x in got.assignments) == [0, 0, 1, 1]
    # Replica 1's step is 100 ms, its fixed 90 ms alone above the bound 1.1 x 55 ms
    # (T*: replica 0 alone takes the 50k tokens at (50k + 60k) / 2e6 = 55 ms, below
    # replica 1's fixed cost): shedding load cannot bring it under, so whether to use
    # it is BR-0's (work-conserving) decision.
    snap = ClusterSnapshot.build([40_000, 10_000], [8, 8], 16,
                                 step_a_s_per_token=[5e-7, 1e-6], step_b_s=[0.03, 0.09])
    assert np.isclose(balanced_step_s(snap), 0.055)
    assert stragglers_to_idle(snap, 0.1) == set()
    assert stragglers_to_idle(snap, 0.7) == {1}  # fixed 90 within 1.7 x 55, 100 above


def test_a_starving_request_waits_for_a_replica_that_is_not_idled() -> None:
    # Replica 1 idled (as above), replica 0 full: a request past its TTFT budget waits
    # (an idled replica takes nothing); once replica 0 frees a slot it goes first.
    full = ClusterSnapshot.build([80_000, 40_000], [16, 8], 16,
                                 step_a_s_per_token=[5e-7, 1e-6], step_b_s=[0.03, 0.045])
    assert stragglers_to_idle(full, 0.1) == {1}
    pool = PromptPool()
    pool.add(PoolRequest("old", 100, arrival_s=0.0, enqueued_s=0.0))
    pool.add(PoolRequest("new", 100, arrival_s=6.0, enqueued_s=6.0))
    pol = build_policy("br0", NO_HOLD | {"cost": "time", "ttft_budget_s": 5.0,
                               "ttft_budget_backlog_s": None,
                               "idle_over_balanced": 0.1,
                               "straggler_prompt_quantile": None})
    assert pol.schedule(full, pool, 6.0, 0).assignments == ()
    freed = ClusterSnapshot.build([80_000, 40_000], [15, 8], 16,
                                  step_a_s_per_token=[5e-7, 1e-6], step_b_s=[0.03, 0.045])
    got = pol.schedule(freed, pool, 6.5, 1)
    assert [(x.request_id, x.replica) for x in got.assignments] == [("old", 0)]
    assert got.aged == 1


def test_a_straggler_with_a_prompt_cap_takes_only_small_prompts() -> None:
    # As above, replica 1 is past the bound. With straggler_prompt_quantile=0.5 it is
    # not idled: it takes prompts up to the pool's median (100 tokens), and the large
    # ones go to replica 0. Without the cap it takes nothing.
    snap = ClusterSnapshot.build([80_000, 40_000], [8, 8], 16,
                                 step_a_s_per_token=[5e-7, 1e-6], step_b_s=[0.03, 0.045])
    pool = _pool([100] * 15 + [5000] * 15)
    capped = build_policy("br0", NO_HOLD | {"cost": "time", "idle_over_balanced": 0.1})
    assert capped.options.straggler_prompt_quantile == 0.5  # the default
    got = capped.schedule(snap, pool, 0.0, 0).assignments
    on_1 = [x.prompt_tokens for x in got if x.replica == 1]
    assert on_1 and max(on_1) == 100
    assert any(x.replica == 0 and x.prompt_tokens == 5000 for x in got)
    idled = build_policy("br0", NO_HOLD | {"cost": "time", "idle_over_balanced": 0.1,
                                 "straggler_prompt_quantile": None}).schedule(
        snap, pool, 0.0, 0).assignments
    assert {x.replica for x in idled} == {0}


@settings(max_examples=150, deadline=None)
@given(st_=states(max_g=8, kv=True, dead=True), data=st.data(),
       s_greedy=st.integers(0, 10), r_max=st.integers(1, 4), shallow=st.booleans())
def test_a_capped_replica_never_takes_a_prompt_above_its_cap(
        st_: tuple[ClusterSnapshot, PromptPool], data: st.DataObject, s_greedy: int,
        r_max: int, shallow: bool) -> None:
    cluster, pool = st_
    g = cluster.num_replicas
    caps = data.draw(st.dictionaries(st.integers(0, g - 1), st.integers(0, 5000),
                                     max_size=g))
    hard = data.draw(st.lists(st.booleans(), min_size=len(pool), max_size=len(pool)))
    starving = [(r, h) for r, h in zip(pool.fcfs(), hard, strict=True)][:3]
    res = run_two_stage(cluster, pool, ScalarMargins(cluster), s_greedy=s_greedy,
                        r_max=r_max, starving=starving, shallow=shallow, size_caps=caps)
    for x in res.assignments:
        assert x.prompt_tokens <= caps.get(x.replica, x.prompt_tokens)
    free = cluster.free_slots
    for r in range(g):
        assert sum(1 for x in res.assignments if x.replica == r) <= free[r]
    # no caps: the same as before the option existed
    plain = run_two_stage(cluster, pool, ScalarMargins(cluster), s_greedy=s_greedy,
                          r_max=r_max, starving=starving, shallow=shallow)
    assert plain.assignments == run_two_stage(
        cluster, pool, ScalarMargins(cluster), s_greedy=s_greedy, r_max=r_max,
        starving=starving, shallow=shallow, size_caps={}).assignments


def test_in_a_shallow_pool_a_straggler_is_idled_not_capped() -> None:
    # Replica 1 is the straggler (as above); replica 0 has 2 free slots. A pool of 7
    # requests is below a quarter of the 32 slots: the cluster is not throughput-bound,
    # so replica 1 is idled (every step stays short) and takes none of the small
    # prompts it would take capped (straggler_cap_min_pool_share=0: always capped).
    snap = ClusterSnapshot.build([80_000, 40_000], [14, 8], 16,
                                 step_a_s_per_token=[5e-7, 1e-6], step_b_s=[0.03, 0.045])
    sizes = [100] * 4 + [5000] * 3

    def run(share: float) -> list[tuple[int, int]]:
        pol = build_policy("br0", NO_HOLD | {"cost": "time", "idle_over_balanced": 0.1,
                                   "straggler_cap_min_pool_share": share})
        return [(x.replica, x.prompt_tokens)
                for x in pol.schedule(snap, _pool(sizes), 0.0, 0).assignments]

    assert run(0.25) == [(0, 5000), (0, 5000)]  # the default: idled
    assert run(0.0) == [(0, 5000), (0, 5000)] + [(1, 100)] * 4  # capped
