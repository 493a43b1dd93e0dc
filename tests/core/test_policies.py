"""Policy properties: hard limits, BR-H/BR-0 equivalence, Stage 2 optimality, determinism."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import (
    ClusterSnapshot,
    ConfigError,
    PolicyContext,
    PoolRequest,
    PromptPool,
    build_policy,
    parse_policy_options,
    policy_class,
    policy_names,
)
from br_serve.core.policies.br0 import ScalarScorer
from br_serve.core.tick import _best_subset
from tests.core.strategies import random_state, states

ALL = sorted(policy_names())


def _horizon(name: str, h: int) -> dict[str, int]:
    """A short window for the policies that look ahead (their options have one)."""
    return {"horizon": h} if policy_class(name).needs.predictor else {}


def test_registry_has_every_named_policy() -> None:
    assert set(ALL) == {"random", "round_robin", "jsq", "p2c", "sglang_total_tokens",
                        "vllm_dp", "dynamo_decode", "min_max", "br0", "brh",
                        "smg_min_tokens", "smg_least_load", "smg_power_of_two",
                        "smg_cache_aware", "vllm_router_p2c", "consistent_hash",
                        "router_round_robin"}


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=60, deadline=None)
@given(st_=states(kv=True, dead=True))
def test_hard_limits(name: str, st_: tuple[ClusterSnapshot, PromptPool]) -> None:
    cluster, pool = st_
    pol = build_policy(name, _horizon(name, 8), PolicyContext(rng=np.random.default_rng(0)))
    res = pol.schedule(cluster, pool, now_s=0.0, tick=0)
    ids = [a.request_id for a in res.assignments]
    assert len(ids) == len(set(ids)), "a request assigned twice"
    per_rep = Counter(a.replica for a in res.assignments)
    tokens: Counter[int] = Counter()
    for a in res.assignments:
        assert a.request_id in pool
        assert a.prompt_tokens == pool.get(a.request_id).prompt_tokens
        tokens[a.replica] += a.prompt_tokens
    free = cluster.free_slots
    for g, n in per_rep.items():
        assert cluster.alive[g], "assigned to a dead replica"
        assert n <= free[g], "slot limit exceeded"
        assert cluster.load_tokens[g] + tokens[g] <= cluster.kv_limit_tokens[g], "KV exceeded"


#: rules that bind a request to one rank by its identity and let it wait for that rank
#: (br_serve.core.policies._sticky): not work-conserving, as in the real routers
STICKY = {"consistent_hash", "smg_cache_aware", "router_round_robin"}


@pytest.mark.parametrize("name", sorted(set(ALL) - STICKY))
@settings(max_examples=30, deadline=None)
@given(st_=states())
def test_work_conserving_without_kv_limit(name: str,
                                          st_: tuple[ClusterSnapshot, PromptPool]) -> None:
    """No KV limit: every free slot is filled while the pool has requests. The bounded
    hold (BR-0 / BR-H, on by default in a busy cluster) is the one deliberate exception:
    off here, tested in test_shallow_trust.py."""
    cluster, pool = st_
    opts: dict[str, object] = dict(_horizon(name, 8))
    if any(f.name == "hold_budget_ms" for f in fields(policy_class(name).Options)):  # type: ignore[arg-type]
        opts["hold_budget_ms"] = 0.0
    pol = build_policy(name, opts, PolicyContext(rng=np.random.default_rng(0)))
    res = pol.schedule(cluster, pool, now_s=0.0, tick=0)
    assert len(res.assignments) == min(len(pool), int(cluster.free_slots.sum()))


def test_brh_h0_equals_br0() -> None:
    """BR-H with a zero window and BR-0's margin weights makes BR-0's decision *while it
    looks ahead*. With the default decode-share rule most drawn states (prompt-led) make
    BR-H take BR-0's decision without looking ahead, which would compare BR-0 with
    itself (measured: 23% of 150 drawn ticks looked ahead with the rule, 100% without);
    the rule is off here and the share of ticks that looked ahead is asserted."""
    looked: list[bool] = []

    @settings(max_examples=150, deadline=None)
    @given(st_=states(max_g=10, kv=True, dead=True), s_greedy=st.integers(0, 12),
           r_max=st.integers(1, 5))
    def check(st_: tuple[ClusterSnapshot, PromptPool], s_greedy: int, r_max: int) -> None:
        cluster, pool = st_
        g_alive = int(cluster.alive.sum())
        common: dict[str, object] = {"s_greedy": s_greedy, "r_max": r_max}
        br0 = build_policy("br0", common)
        brh = build_policy("brh", {"horizon": 0, "alpha": 1.0, "beta": float(g_alive),
                                   "trust_decode_share": None, **common})
        a = br0.schedule(cluster, pool, 0.0, 0)
        b = brh.schedule(cluster, pool, 0.0, 0)
        looked.append(b.lookahead)
        assert a.assignments == b.assignments

    check()
    share = sum(looked) / len(looked)
    assert share >= 0.9, f"only {share:.0%} of the drawn ticks looked ahead"


@settings(max_examples=300)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
       margin=st.integers(0, 6000), g=st.integers(2, 16), max_n=st.integers(1, 6),
       room=st.integers(0, 20000))
def test_stage2_subset_is_brute_force_optimum(sizes: list[int], margin: int, g: int,
                                              max_n: int, room: int) -> None:
    fits = [i for i, s in enumerate(sizes) if s <= room]
    if not fits:
        return
    sc = ScalarScorer(float(margin), g)
    chosen, guarded = _best_subset(fits, sizes, sc, max_n, room)
    best = -np.inf
    for k in range(1, min(max_n, len(fits)) + 1):
        for c in combinations(fits, k):
            d = sum(sizes[i] for i in c)
            if d <= room:
                best = max(best, sc(float(d)))
    got = sc(float(sum(sizes[i] for i in chosen)))
    if best > 0:
        assert not guarded and got == best
    else:  # starvation guard: the best single request anyway
        assert guarded and len(chosen) == 1
        assert got == max(sc(float(sizes[i])) for i in fits)


@pytest.mark.parametrize("name", ALL)
def test_same_seed_same_assignments(name: str) -> None:
    def run(seed: int) -> list[tuple[str, int]]:
        rng = np.random.default_rng(123)
        pol = build_policy(name, _horizon(name, 16),
                           PolicyContext(rng=np.random.default_rng(seed)))
        out = []
        for tick in range(5):
            cluster, pool = random_state(rng, 8, 8, 64)
            out += [(a.request_id, a.replica) for a in
                    pol.schedule(cluster, pool, float(tick), tick).assignments]
        return out

    assert run(7) == run(7)


@pytest.mark.parametrize("name", ["br0", "brh", "jsq", "min_max"])
def test_every_request_assigned_within_bounded_ticks(name: str) -> None:
    """Slots free up every tick and new requests keep arriving (some huge): nobody
    waits longer than its FCFS wait (at most the pool capacity plus the first fill)
    times the fairness factor, plus the slack and a slack's worth of starving
    requests ahead of it: the fairness rule bounds how far BR may reorder the pool."""
    rng = np.random.default_rng(5)
    g, slots, cap, slack, factor = 4, 4, 24, 8, 2.0
    ageing = {"max_wait_beyond_fcfs_s": float(slack), "fcfs_wait_factor": factor}
    pol = build_policy(name, {**_horizon(name, 4), **(ageing if name in ("br0", "brh") else {})},
                       PolicyContext(rng=np.random.default_rng(1)))
    pool = PromptPool(capacity=cap)
    running: list[list[int]] = [[] for _ in range(g)]
    enq: dict[str, int] = {}
    waits: list[int] = []
    nid = 0
    for tick in range(400):
        while not pool.is_full():  # keep the pool full: the hardest case for ageing
            s = int(rng.choice([50, 400, 3000, 10**6], p=[0.4, 0.3, 0.27, 0.03]))
            rid = f"r{nid}"
            nid += 1
            pool.add(PoolRequest(rid, s, enqueued_s=float(tick), enqueued_tick=tick))
            enq[rid] = tick
        # exactly one running request finishes per tick somewhere (slots recur)
        full = [r for r in range(g) if running[r]]
        if full:
            r = int(rng.choice(full))
            running[r].pop(int(rng.integers(len(running[r]))))
        load = [sum(x) for x in running]
        cluster = ClusterSnapshot.build(load, [len(x) for x in running], slots)
        res = pol.schedule(cluster, pool, float(tick), tick)
        pool.remove_many(res.assignments)
        for a in res.assignments:
            running[a.replica].append(a.prompt_tokens)
            waits.append(tick - enq.pop(a.request_id))
    bound = factor * (cap + g * slots) + 2 * slack
    assert waits and max(waits) <= bound
    assert all(tick_in >= 400 - bound for tick_in in enq.values())


@pytest.mark.parametrize(
    ("field", "value"),
    [("horizon", -1), ("gamma", 0.0), ("gamma", 1.5), ("r_max", 0), ("s_greedy", -2),
     ("fcfs_wait_factor", 0.5), ("horizon", "soon"), ("alpha", True), ("beta", -1.0)],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        parse_policy_options("brh", {field: value})


def test_unknown_policy_and_option_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"^policy: unknown 'nope'"):
        build_policy("nope")
    with pytest.raises(ConfigError, match=r"^horizn:"):
        parse_policy_options("brh", {"horizn": 3})
    with pytest.raises(ConfigError, match=r"^r_max:"):  # jsq has no options at all
        build_policy("jsq", {"r_max": 3})


def test_options_coerce_command_line_strings() -> None:
    opts = parse_policy_options("brh", {"horizon": "40", "beta": "none", "gamma": "0.9"})
    assert (opts.horizon, opts.beta, opts.gamma) == (40, None, 0.9)  # type: ignore[attr-defined]
    assert opts.replace(horizon="8").horizon == 8  # type: ignore[attr-defined]
