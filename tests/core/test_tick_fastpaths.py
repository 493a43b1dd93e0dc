"""The tick's shortcuts make exactly the decisions of the long way round.

Each shortcut (docs/tick-latency.md) skips work whose result is known: the single-slot
Stage 2 compares only the heads of the two candidate runs, and BR-H skips the
predictor when the pool refills any drop the window could project.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import (
    ClusterSnapshot,
    PolicyContext,
    PoolRequest,
    Prediction,
    PromptPool,
    RunningRequests,
    build_policy,
)
from br_serve.core.fscore import discount_weights
from br_serve.core.horizon import GrowingScore
from br_serve.core.policies.br0 import ScalarScorer
from br_serve.core.policies.brh import BRH
from br_serve.core.tick import PoolCursor, _best_single
from br_serve.core.timecost import TimeScorer
from tests.core.strategies import states


def _scorer(kind: str, margin: float, g: int, rng: np.random.Generator
            ) -> ScalarScorer | TimeScorer | GrowingScore:
    if kind == "scalar":
        return ScalarScorer(margin, g)
    if kind == "time":
        return TimeScorer(margin * 1e-6, float(rng.uniform(1e-7, 1e-6)),
                          float(rng.uniform(0, 1e-4)), g)
    h = 8
    margins = margin + rng.normal(0, 200, h + 1).cumsum()
    return GrowingScore(margins, np.arange(h + 1, dtype=np.float64),
                        discount_weights(h, float(rng.choice([1.0, 0.9]))), 1.0, float(g),
                        False, float(np.arange(h + 1) @ discount_weights(h, 1.0)))


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 4000), min_size=1, max_size=30),
       taken=st.lists(st.integers(0, 29), max_size=6), margin=st.integers(-500, 5000),
       room=st.integers(0, 6000), g=st.integers(1, 16), r_max=st.integers(1, 5),
       kind=st.sampled_from(["scalar", "time", "growing"]), seed=st.integers(0, 2**16))
def test_single_slot_choice_equals_max_over_all_candidates(
        sizes: list[int], taken: list[int], margin: int, room: int, g: int, r_max: int,
        kind: str, seed: int) -> None:
    pool = PromptPool()
    for i, s in enumerate(sizes):
        pool.add(PoolRequest(f"r{i}", s))
    cur = PoolCursor(pool)
    for t in set(taken):
        if t < len(sizes):
            cur.take(t)
    sc = _scorer(kind, float(margin), g, np.random.default_rng(seed))
    # the long way: r_max candidates below the peak, topped up from above, max F
    cands = cur.below(sc.peak, room, r_max)
    if len(cands) < r_max:
        cands += cur.above(sc.peak, room, r_max - len(cands))
    head, enough = cur.below_head(sc.peak, room, r_max)
    below = cur.below(sc.peak, room, r_max)
    assert head == (below[0] if below else None) and enough == (len(below) == r_max)
    short = [] if head is None else [head]
    if not enough:
        short += cur.above(sc.peak, room, 1)
    assert bool(cands) == bool(short)
    if cands:
        best = max(cands, key=lambda i: sc(float(cur.sizes[i])))
        got = _best_single(short, cur.sizes, sc)
        if kind == "scalar" and g > 1:  # integer-valued, strictly peaked: the same index
            assert got == best
        # otherwise F can be flat past the peak (G = 1) and only rounding breaks the
        # tie: the same score
        assert sc(float(cur.sizes[got])) >= sc(float(cur.sizes[best])) - 1e-9 * max(
            1.0, abs(sc(float(cur.sizes[best]))))


class _RandomPredictor:
    """Any answer the contract allows: p_fin in [0, 1], mu_rem in [0, H]."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        n = len(running)
        p = self.rng.uniform(0, 1, n) * (self.rng.uniform(0, 1, n) < 0.5)
        return Prediction(p_fin=p, mu_rem=self.rng.uniform(0, horizon_steps, n))

    def observe(self, finished: object) -> None:
        return None


@settings(max_examples=200, deadline=None)
@given(st_=states(max_g=8), seed=st.integers(0, 2**16), h=st.sampled_from([0, 5, 40]),
       trust=st.sampled_from([0.0, 0.5, 1.0]))
def test_skipping_the_predictor_never_changes_the_trust_rule(
        st_: tuple[ClusterSnapshot, PromptPool], seed: int, h: int, trust: float) -> None:
    cluster, pool = st_
    opts = {"horizon": h, "trust_refill_coverage": trust, "trust_decode_share": None}
    pol = build_policy("brh", opts, PolicyContext(predictor=_RandomPredictor(seed)))
    assert isinstance(pol, BRH)
    if pol.pool_refills_any_drop(cluster, pool):
        ends, p_fin, ok = pol._predict(cluster)
        assert ok
        if ends is not None:  # whatever the predictor said, the pool refills it all
            assert pol.refill_coverage(cluster, pool, ends, p_fin) >= 1.0 - 1e-12
    # and the tick decides the same with the shortcut as without it
    fast = build_policy("brh", opts, PolicyContext(predictor=_RandomPredictor(seed))
                        ).schedule(cluster, pool, 0.0, 0)
    slow_pol = build_policy("brh", opts, PolicyContext(predictor=_RandomPredictor(seed)))
    with mock.patch.object(BRH, "pool_refills_any_drop", return_value=False):
        slow = slow_pol.schedule(cluster, pool, 0.0, 0)
    assert fast.assignments == slow.assignments
    assert fast.lookahead == slow.lookahead


def test_the_shortcut_fires_on_a_deep_pool_of_large_prompts() -> None:
    run = RunningRequests.build([0, 1], [5000, 3000], [1000, 200])
    cluster = ClusterSnapshot.build([6000, 3200], [1, 1], 2, running=run)
    pool = PromptPool()
    for i, s in enumerate([100, 3300, 7000]):
        pool.add(PoolRequest(f"r{i}", s))
    pol = build_policy("brh", {"horizon": 10, "trust_refill_coverage": 0.5},
                       PolicyContext(predictor=_RandomPredictor(0)))
    assert isinstance(pol, BRH)
    # 7,000 >= 6,000 + 10 and 3,300 >= 3,200 + 10: every drop is refilled
    assert pol.pool_refills_any_drop(cluster, pool)
    # a second load of 3,300: its bound 3,310 is above the second prompt, 3,300
    run2 = RunningRequests.build([0, 1], [5000, 3100], [1000, 200])
    cluster2 = ClusterSnapshot.build([6000, 3300], [1, 1], 2, running=run2)
    assert not pol.pool_refills_any_drop(cluster2, pool)


def test_flagged_is_replace_of_the_two_flags() -> None:
    from dataclasses import fields, replace

    from br_serve.core import Assignment, TickResult

    res = TickResult((Assignment("a", 1, 5),), 1, 2, 3, 4, True, 5, 6, 7.5, True)
    assert {f.name for f in fields(TickResult)} == {
        "assignments", "stage1", "stage2", "guard", "aged", "predictor_ok", "shallow",
        "held", "retick_s", "lookahead"}  # a new field must be copied by flagged()
    for ok in (True, False):
        for look in (True, False):
            assert res.flagged(ok, look) == replace(res, predictor_ok=ok, lookahead=look)
