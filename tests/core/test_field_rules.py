"""The field's rules (docs/core.md, "The field's rules") on hand-made states: each pick
is what the real rule picks, worked out from the source each policy's docstring cites."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from br_serve.core import ClusterSnapshot, PolicyContext, PoolRequest, PromptPool, build_policy


def _pool(*prompts: int, hash_ids: Sequence[tuple[int, ...]] | None = None,
          start: int = 0) -> PromptPool:
    pool = PromptPool(1000)
    for i, s in enumerate(prompts):
        pool.add(PoolRequest(f"r{start + i}", s, enqueued_tick=i,
                             hash_ids=None if hash_ids is None else hash_ids[i]))
    return pool


def _picks(name: str, cluster: ClusterSnapshot, pool: PromptPool, now_s: float = 0.0,
           options: Mapping[str, object] | None = None, policy: object = None
           ) -> list[tuple[str, int]]:
    pol = policy or build_policy(name, options, PolicyContext(rng=np.random.default_rng(0)))
    res = pol.schedule(cluster, pool, now_s, 0)  # type: ignore[attr-defined]
    return [(a.request_id, a.replica) for a in res.assignments]


def test_min_tokens_adds_the_prompt_between_polls_and_refreshes_on_the_grid() -> None:
    pol = build_policy("smg_min_tokens")  # 10 s polls, prompt increments
    c0 = ClusterSnapshot.build([100, 50, 300, 10], [1, 1, 1, 1], 8)
    # poll at t=0: [100, 50, 300, 10]; +20 -> r3 30; +30 -> r3 60; +40 -> r1 90; +60 -> r3
    assert _picks("", c0, _pool(20, 30, 40, 60), 0.0, policy=pol) == [
        ("r0", 3), ("r1", 3), ("r2", 1), ("r3", 3)]
    # 5 s later the engines report rank 0 empty, but no poll is due: the cached copy
    # [100, 90, 300, 120] still rules
    c1 = ClusterSnapshot.build([0, 50, 300, 10], [0, 1, 1, 1], 8)
    assert _picks("", c1, _pool(5, start=10), 5.0, policy=pol) == [("r10", 1)]
    # at 10 s the poll is due: rank 0's 0 tokens win
    assert _picks("", c1, _pool(5, start=11), 10.0, policy=pol) == [("r11", 0)]


def test_min_tokens_with_unit_increments_herds_until_the_next_poll() -> None:
    c = ClusterSnapshot.build([100, 50, 300, 10], [0, 0, 0, 0], 3)
    picks = _picks("smg_min_tokens", c, _pool(500, 500, 500, 500),
                   options={"min_tokens_increment": "one"})
    # +1 per request: rank 3 stays the minimum until its 3 slots are gone
    assert picks == [("r0", 3), ("r1", 3), ("r2", 3), ("r3", 1)]


def test_least_load_credits_in_flight_work_over_throughput() -> None:
    # step time b = 0.03 s: rank 0 runs 3 (100 tok/s), rank 1 runs 1 (33.3 tok/s),
    # rank 2 runs none (default 2000 tok/s); no KV limit, so no KV term
    c = ClusterSnapshot.build([0, 0, 0], [3, 1, 0], 16, step_a_s_per_token=0.0)
    picks = _picks("smg_least_load", c, _pool(10, 10, 10, 10))
    # all 0 -> rank 0 (1024/100 = 10.2 s); then rank 1 (0) -> 1024/33.3 = 30.7 s;
    # then rank 2 (0) -> 1024/2000 = 0.51 s; then rank 2 again (0.51 < 10.2)
    assert picks == [("r0", 0), ("r1", 1), ("r2", 2), ("r3", 2)]


def test_least_load_kv_pressure_and_exact_tokens() -> None:
    # equal rates (2 running each, a = 0); KV use 0.5 vs 0.9: 0.15 * 1 vs 0.15 * 9
    c = ClusterSnapshot.build([500, 900], [2, 2], 16, kv_limit_tokens=1000,
                              step_a_s_per_token=0.0)
    opts = {"least_load_tokens": "prompt"}
    # rate 66.7 tok/s: r0 (10 tok) -> rank 0 (0.15 < 1.35), in flight 0.15 s more;
    # r1 -> rank 0 again (0.30); a 100-token r2 -> rank 0 (0.45) ... until 1.35
    picks = _picks("smg_least_load", c, _pool(10, 10, 100), options=opts)
    assert [g for _, g in picks] == [0, 0, 0]
    none = _picks("smg_least_load", c, _pool(10, 10, 10),
                  options={"load_reports": "none"})
    assert [g for _, g in none] == [0, 1, 0]  # JSQ on in-flight counts
    # no KV limit: the capacity option gives the polled k; 300 / 1000 beats 800 / 1000
    c2 = ClusterSnapshot.build([800, 300], [2, 2], 16, step_a_s_per_token=0.0)
    assert _picks("smg_least_load", c2, _pool(10))[0][1] == 0  # no KV term: tie -> 0
    assert _picks("smg_least_load", c2, _pool(10),
                  options={"kv_capacity_tokens": 1000})[0][1] == 1


def test_power_of_two_uses_the_stale_poll_for_a_whole_interval() -> None:
    # two ranks: the pair is always both; rank 1 reported fewer tokens at the poll
    c = ClusterSnapshot.build([400, 100], [0, 0], 16)
    picks = _picks("smg_power_of_two", c, _pool(*[1000] * 6))
    assert [g for _, g in picks] == [1] * 6  # nothing added between polls: herding
    fresh = _picks("smg_power_of_two", c, _pool(*[1000] * 6),
                   options={"load_reports": "none"})
    assert Counter(g for _, g in fresh) == {0: 3, 1: 3}  # in-flight counts alternate


def test_cache_aware_follows_the_prefix_then_falls_back_to_least_loaded() -> None:
    c = ClusterSnapshot.build([0, 0, 0], [2, 0, 1], 4)
    ids = [(7, 8, 9), (7, 8, 10), (1, 2, 3), (7, 99, 98)]
    picks = _picks("smg_cache_aware", c, _pool(1536, 1536, 1536, 1536, hash_ids=ids))
    # r0: no match -> least loaded (rank 1); r1 shares 2 of 3 blocks (67% > 30%) ->
    # rank 1; r2: no match -> least loaded among (2+0, 0+2, 1+0) in flight -> rank 2;
    # r3 shares 1 of 3 blocks (33% > 30%) -> rank 1, the last to route through (7,)
    assert picks == [("r0", 1), ("r1", 1), ("r2", 2), ("r3", 1)]


def test_cache_aware_without_hash_ids_is_jsq_with_the_routed_count_tie_break() -> None:
    pol = build_policy("smg_cache_aware")
    c = ClusterSnapshot.build([0, 0], [0, 0], 4)
    assert _picks("", c, _pool(10), policy=pol) == [("r0", 0)]
    # both ranks empty again, but rank 0 was routed one request: rank 1 wins the tie
    assert _picks("", c, _pool(10, start=1), policy=pol) == [("r1", 1)]


def test_sticky_rules_wait_for_their_rank() -> None:
    pol = build_policy("smg_cache_aware")
    full = ClusterSnapshot.build([0, 0], [1, 0], 1)  # rank 0 full
    ids = [(5, 6)]
    assert _picks("", ClusterSnapshot.build([0, 0], [0, 1], 1),
                  _pool(512, hash_ids=ids), policy=pol) == [("r0", 0)]
    # same prefix, tenant rank 0 is full: the request waits (rank 1 is free)
    assert _picks("", full, _pool(1024, hash_ids=[(5, 6)], start=1), policy=pol) == []
    ch = build_policy("consistent_hash")
    c = ClusterSnapshot.build([0] * 4, [0] * 4, 1)
    first = _picks("", c, _pool(10, 10, 10, 10, 10, 10, 10, 10), policy=ch)
    taken = Counter(g for _, g in first)
    assert all(n == 1 for n in taken.values())  # one slot each: the rest wait


def test_consistent_hash_is_stable_and_spreads_uniformly() -> None:
    a, b = build_policy("consistent_hash"), build_policy("consistent_hash")
    alive = [True] * 8
    ranks = [a.rank_of(f"r{i}", alive) for i in range(8000)]  # type: ignore[attr-defined]
    assert ranks == [b.rank_of(f"r{i}", alive) for i in range(8000)]  # type: ignore[attr-defined]
    counts = Counter(ranks)
    assert len(counts) == 8 and all(750 <= n <= 1250 for n in counts.values())
    dead = [True] * 7 + [False]  # a dead rank's keys go to the first alive one
    assert all(a.rank_of(f"r{i}", dead) == (0 if g == 7 else g)  # type: ignore[attr-defined]
               for i, g in enumerate(ranks))


def test_vllm_router_p2c_compares_in_flight_counts() -> None:
    c = ClusterSnapshot.build([10**6, 0], [1, 3], 8)  # tokens do not matter
    picks = _picks("vllm_router_p2c", c, _pool(10, 10, 10))
    # 1 vs 3 -> rank 0 (2); 2 vs 3 -> rank 0 (3); 3 vs 3: the first drawn
    assert [g for _, g in picks][:2] == [0, 0]


def test_vllm_dp_rotates_ties_like_vllm() -> None:
    pol = build_policy("vllm_dp")
    c = ClusterSnapshot.build([0] * 4, [0] * 4, 8)
    # the same empty state at every tick: the scan start advances one engine per
    # request, so ties go 0, 1, 2, 3 (JSQ would answer 0 every time)
    got = [_picks("", c, _pool(10, start=t), float(t), policy=pol)[0][1] for t in range(4)]
    assert got == [0, 1, 2, 3]
