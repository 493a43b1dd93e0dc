"""Ageing in operator terms: wait beyond FCFS, TTFT budget, the soft phase."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import ClusterSnapshot, PolicyContext, PoolRequest, PromptPool, build_policy
from br_serve.core.ageing import Ageing, AgeingRule


def _pool(sizes: list[int], arrival_s: float = 0.0) -> PromptPool:
    pool = PromptPool()
    for i, s in enumerate(sizes):
        pool.add(PoolRequest(f"r{i}", s, arrival_s=arrival_s))
    return pool


def _tick(ag: Ageing, pool: PromptPool, now_s: float, release: list[str]
          ) -> list[tuple[str, bool]]:
    """One tick: what starves at ``now_s`` (overdue: True), then the tick releases
    ``release``."""
    out = [(r.request_id, urgency >= 1.0) for r, urgency in ag.starving(pool, now_s, 0)]
    ag.record(pool, len(release), now_s)
    for rid in release:
        pool.remove(rid)
    return out


def test_wait_beyond_fcfs_counts_from_the_fcfs_turn() -> None:
    ag = Ageing(AgeingRule(max_wait_beyond_fcfs_s=10.0, soft_share=0.25))
    pool = _pool([5000, 10, 10])
    # t=0: nothing released yet, so nobody's turn has come.
    assert _tick(ag, pool, 0.0, []) == []
    # t=1: the tick releases r1 (newer): r0's FCFS turn (release 1) came at t=1.
    assert _tick(ag, pool, 1.0, ["r1"]) == []
    assert ag.released_at(1) == 1.0
    assert _tick(ag, pool, 3.0, []) == []  # 2 s late: under a quarter of the budget
    assert _tick(ag, pool, 4.0, []) == [("r0", False)]  # 3 s: soft, place where it fits
    assert _tick(ag, pool, 11.0, []) == [("r0", True)]  # 10 s: hard
    # r2 entered after r0 and r1: its turn (release 3) has not come, so it never
    # starves however long it waits, while r0 is still in the pool.
    assert [r for r, _ in _tick(ag, pool, 500.0, [])] == ["r0"]


def test_relative_rule_scales_with_the_fcfs_wait() -> None:
    """Pool wait <= factor x FCFS wait + slack: r0 entered at 0, its FCFS turn came at
    t = 5, so with factor 2 and slack 10 it is due at 2 x 5 + 10 = 20 (soft from 12.5)."""
    ag = Ageing(AgeingRule(max_wait_beyond_fcfs_s=10.0, soft_share=0.25,
                           fcfs_wait_factor=2.0))
    pool = _pool([5000, 10, 10])
    assert _tick(ag, pool, 5.0, ["r1"]) == []  # r0's turn: release 1 at t = 5
    assert _tick(ag, pool, 12.0, []) == []  # base 10: 2 s of 10 into the slack
    assert _tick(ag, pool, 12.5, []) == [("r0", False)]  # a quarter: lead time
    assert _tick(ag, pool, 19.9, []) == [("r0", False)]
    assert _tick(ag, pool, 20.0, []) == [("r0", True)]  # due
    # with factor 1 the same history is due at 5 + 10 = 15
    ag1 = Ageing(AgeingRule(max_wait_beyond_fcfs_s=10.0, soft_share=1.0))
    pool1 = _pool([5000, 10, 10])
    _tick(ag1, pool1, 5.0, ["r1"])
    assert _tick(ag1, pool1, 14.9, []) == []
    assert _tick(ag1, pool1, 15.0, []) == [("r0", True)]


def test_ttft_budget_counts_from_arrival() -> None:
    ag = Ageing(AgeingRule(ttft_budget_s=4.0, soft_share=1.0))
    pool = _pool([100, 200], arrival_s=0.0)
    assert _tick(ag, pool, 3.9, []) == []
    assert _tick(ag, pool, 4.0, []) == [("r0", True), ("r1", True)]


def test_ttft_budget_binds_only_where_fcfs_would_have_started_it_soon() -> None:
    """With a backlog window the budget binds a request whose FCFS turn came within the
    window of its arrival; one FCFS would have kept waiting longer is backlog work."""
    ag = Ageing(AgeingRule(ttft_budget_s=4.0, soft_share=1.0, ttft_backlog_s=10.0))
    pool = _pool([100, 200, 300, 400], arrival_s=0.0)
    # before any release nobody's FCFS turn has come: the budget binds nobody yet
    assert _tick(ag, pool, 5.0, []) == []
    # release 1 at t = 6 (r3 taken): r0's turn came 6 s after its arrival, within 10 s
    assert _tick(ag, pool, 6.0, ["r3"]) == []
    assert _tick(ag, pool, 6.5, []) == [("r0", True)]
    # release 2 at t = 12 (r2 taken): r1's turn came 12 s after arrival: backlog work,
    # never bound by the budget however long it waits
    assert _tick(ag, pool, 12.0, ["r2"]) == [("r0", True)]
    assert _tick(ag, pool, 500.0, []) == [("r0", True)]
    # without the window the budget binds every request past it, turn or not
    ag_all = Ageing(AgeingRule(ttft_budget_s=4.0, soft_share=1.0))
    assert _tick(ag_all, _pool([100, 200], arrival_s=0.0), 5.0, []) == [
        ("r0", True), ("r1", True)]


@pytest.mark.parametrize("factor", [None, 2.0])
def test_ttft_budget_stands_down_for_a_queue_formed_in_a_burst(factor: float | None
                                                                ) -> None:
    """Issue 26: a batch arriving at once drains fast, so its FCFS turns come within the
    backlog window; the queue-age test tells it from an at-capacity queue, where the
    queue ahead formed from arrivals spread over time."""
    rule = AgeingRule(ttft_budget_s=4.0, soft_share=1.0, ttft_backlog_s=10.0,
                      ttft_queue_age_factor=factor)
    # a burst: four requests arrive together at t = 0, the tick at t = 1 takes r3
    # (BalanceRoute's order): r0's FCFS turn came 1 s after arrival, within the window
    ag = Ageing(rule)
    pool = _pool([100, 200, 300, 400], arrival_s=0.0)
    assert _tick(ag, pool, 0.0, []) == []
    assert _tick(ag, pool, 1.0, ["r3"]) == []
    burst = _tick(ag, pool, 5.0, [])
    # online traffic: r0 arrived at 0 and waits; r1 arrives at 3 behind a queue 3 s
    # old; r2 is taken at 3 (r0's turn), r0 at 3.5 (r1's turn: 0.5 s <= 2 x 3 s)
    ag2 = Ageing(rule)
    pool2 = PromptPool()
    pool2.add(PoolRequest("r0", 100, arrival_s=0.0))
    assert _tick(ag2, pool2, 0.0, []) == []
    pool2.add(PoolRequest("r1", 5000, arrival_s=3.0, enqueued_s=3.0))
    pool2.add(PoolRequest("r2", 10, arrival_s=3.0, enqueued_s=3.0))
    assert _tick(ag2, pool2, 3.0, ["r2"]) == []
    assert _tick(ag2, pool2, 3.5, ["r0"]) == []
    online = _tick(ag2, pool2, 7.0, [])
    assert online == [("r1", True)]  # it arrived 4 s ago: the budget binds either way
    if factor is None:
        assert burst == [("r0", True)]  # the one window puts the batch in FCFS order
    else:
        assert burst == []  # backlog work: the relative rule (off here) binds it


@pytest.mark.parametrize("floor_s", [None, 2.0])
def test_a_clump_fcfs_starts_within_the_floor_is_online(floor_s: float | None) -> None:
    """Online traffic arrives in clumps: requests at one instant into an empty pool have
    a queue age of 0, as a batch has. One whose FCFS turn came within
    ``ttft_online_wait_s`` of its arrival is online work whatever that age; a later turn
    is still judged by the age test."""
    rule = AgeingRule(ttft_budget_s=4.0, soft_share=1.0, ttft_backlog_s=10.0,
                      ttft_queue_age_factor=4.0, ttft_online_wait_s=floor_s)
    ag = Ageing(rule)
    pool = _pool([100, 200, 300, 400], arrival_s=0.0)
    assert _tick(ag, pool, 0.0, []) == []
    # r0's FCFS turn comes 1 s after arrival (r3 taken), r1's 3 s after (r2 taken)
    assert _tick(ag, pool, 1.0, ["r3"]) == []
    assert _tick(ag, pool, 3.0, ["r2"]) == []
    late = _tick(ag, pool, 5.0, [])
    if floor_s is None:
        assert late == []  # the clump reads as a batch: backlog work
    else:
        assert late == [("r0", True)]  # r0: turn 1 s <= 2 s; r1: 3 s > 2 s, age 0


def test_every_rule_off_means_nobody_starves() -> None:
    ag = Ageing(AgeingRule())
    pool = _pool([100])
    _tick(ag, pool, 0.0, [])
    pool.add(PoolRequest("x", 5))
    _tick(ag, pool, 1.0, ["x"])
    assert _tick(ag, pool, 1e9, []) == []


def test_a_late_request_is_placed_before_the_stages() -> None:
    # r0 (9,000 tokens) overflows every margin; the cluster keeps choosing the small
    # ones until r0's turn is 30 s past, then ageing forces it to the best-F replica.
    cluster = ClusterSnapshot.build([1000, 100], [1, 1], 2)
    pool = _pool([9000, 10, 12, 14])
    pol = build_policy("br0", {"max_wait_beyond_fcfs_s": 30.0, "ageing_soft_share": 1.0,
                               "ttft_budget_s": None,
                               "shallow_pool": False})
    first = pol.schedule(cluster, pool, 0.0, 0)
    assert "r0" not in [a.request_id for a in first.assignments] and first.aged == 0
    pool.remove_many(first.assignments)
    assert list(pol.ageing.starving(pool, 29.0, 1)) == []  # type: ignore[attr-defined]
    late = pol.schedule(cluster, pool, 31.0, 2)
    assert late.aged == 1
    assert late.assignments[0].request_id == "r0"
    assert late.assignments[0].replica == 1  # the larger margin


def test_soft_late_request_goes_only_where_it_fills_well() -> None:
    # Replica margins 3,000 (replica 1) and 0 (replica 0). r0 (2,000 tokens) is soft-late:
    # it fills 2/3 of replica 1's margin, so it goes there first; a soft-late 500 would
    # fill only 1/6 and is left to the stages.
    cluster = ClusterSnapshot.build([4000, 1000], [1, 1], 2)
    opts = {"max_wait_beyond_fcfs_s": 10.0, "ageing_soft_share": 0.25,
            "ageing_soft_fill": 0.5, "shallow_pool": False, "ttft_budget_s": None}
    for size, aged in ((2000, 1), (500, 0)):
        pool = _pool([size, 10, 20, 30])
        pol = build_policy("br0", opts)
        pool.remove_many(pol.schedule(ClusterSnapshot.build([0, 0], [2, 1], 2), pool, 0.0,
                                      0).assignments)
        res = pol.schedule(cluster, pool, 5.0, 1)  # r0's turn came at t=0: 5 s late
        assert res.aged == aged
        if aged:
            assert (res.assignments[0].request_id, res.assignments[0].replica) == ("r0", 1)


@pytest.mark.parametrize("prompt_clock", [False, True])
@pytest.mark.parametrize("name", ["br0", "brh"])
@settings(max_examples=8, deadline=None)
@given(budget=st.sampled_from([3.0, 10.0, 25.0]), seed=st.integers(0, 1000))
def test_wait_beyond_fcfs_is_bounded(name: str, prompt_clock: bool, budget: float,
                                     seed: int) -> None:
    """A full pool with some huge prompts, one slot freed per tick (1 s): every
    request's wait beyond its FCFS turn on the release count (``T_q - T_p``) stays within
    the budget plus the ticks the older late requests ahead of it can take (at most a
    pool's worth). With the prompt-token clock, a huge prompt released out of order
    moves the token clock past up to a pool's worth of requests at once, and they fall
    due together: a request can also wait behind one such group (a second pool's worth;
    measured 39 ticks against the count clock's 26 at budget 3 on seeds 0-5)."""
    rng = np.random.default_rng(seed)
    g, slots, cap = 4, 4, 24
    opts: dict[str, object] = {"max_wait_beyond_fcfs_s": budget,
                               "ageing_prompt_clock": prompt_clock}
    if name == "brh":
        opts["horizon"] = 4
    pol = build_policy(name, opts, PolicyContext(rng=np.random.default_rng(1)))
    pool = PromptPool(capacity=cap)
    running: list[list[int]] = [[] for _ in range(g)]
    rank: dict[str, int] = {}
    admitted: list[tuple[float, str]] = []
    nid = 0
    for tick in range(300):
        while not pool.is_full():
            s = int(rng.choice([50, 400, 3000, 10**6], p=[0.4, 0.3, 0.27, 0.03]))
            rid = f"r{nid}"
            rank[rid] = nid
            nid += 1
            pool.add(PoolRequest(rid, s, enqueued_s=float(tick), enqueued_tick=tick))
        full = [r for r in range(g) if running[r]]
        if full:
            r = int(rng.choice(full))
            running[r].pop(int(rng.integers(len(running[r]))))
        cluster = ClusterSnapshot.build([sum(x) for x in running], [len(x) for x in running],
                                        slots)
        res = pol.schedule(cluster, pool, float(tick), tick)
        pool.remove_many(res.assignments)
        for a in res.assignments:
            running[a.replica].append(a.prompt_tokens)
            admitted.append((float(tick), a.request_id))
    times = [t for t, _ in admitted]
    worst = 0.0
    for t_q, rid in admitted:
        p = rank[rid]
        if p < len(times):
            worst = max(worst, t_q - times[p])
    assert worst <= budget + (2 if prompt_clock else 1) * cap + 1


def test_queue_age_factor_is_validated_by_name() -> None:
    from br_serve.core.options import ConfigError

    with pytest.raises(ConfigError, match="ttft_budget_queue_age_factor"):
        build_policy("br0", {"ttft_budget_queue_age_factor": -1.0})
    rule = build_policy("br0", {}).options.ageing_rule()
    assert rule.ttft_queue_age_factor == 4.0


def test_prompt_clock_reads_the_turn_on_released_prompt_tokens() -> None:
    """A policy that releases a large newer prompt first advances the prompt-token
    clock past its elders: FCFS, releasing the same prompts in order, would have served
    r0 and r1 (20 tokens) before r2 (980). With ``prompt_clock`` r1's turn came with
    that release (t = 1), so it is due at 1 + 10; on the release count alone its turn
    (release 2) has not come and it never starves."""
    def run(prompt_clock: bool) -> list[list[tuple[str, bool]]]:
        ag = Ageing(AgeingRule(max_wait_beyond_fcfs_s=10.0, soft_share=1.0,
                               prompt_clock=prompt_clock))
        pool = _pool([10, 10, 980])
        out = [_tick(ag, pool, 0.0, [])]
        ag.starving(pool, 1.0, 0)  # the tick reads the pool first, as a policy does
        ag.record(pool, 1, 1.0, assigned_tokens=980)
        pool.remove("r2")
        out += [_tick(ag, pool, t, []) for t in (10.9, 11.0)]
        return out

    assert run(False) == [[], [], [("r0", True)]]
    assert run(True) == [[], [], [("r0", True), ("r1", True)]]


def test_prompt_clock_is_the_earlier_of_the_two() -> None:
    """Small prompts released first: the count runs ahead of the tokens, and the turn
    is the count's (the prompt clock never loosens the bound)."""
    for prompt_clock in (False, True):
        ag = Ageing(AgeingRule(max_wait_beyond_fcfs_s=10.0, soft_share=1.0,
                               prompt_clock=prompt_clock))
        pool = _pool([1000, 1, 1])
        ag.starving(pool, 2.0, 0)
        ag.record(pool, 1, 2.0, assigned_tokens=1)
        pool.remove("r1")
        assert _tick(ag, pool, 11.9, []) == []
        assert _tick(ag, pool, 12.0, []) == [("r0", True)]  # count turn t = 2: due 12
