"""The tick's shortcuts make exactly the decisions of the long way round.

Each shortcut (docs/tick-latency.md) skips work whose result is known: the single-slot
Stage 2 compares only the heads of the two candidate runs, and BR-H skips the
predictor when the pool refills any drop the window could project.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import (
    PoolRequest,
    PromptPool,
)
from br_serve.core.fscore import discount_weights
from br_serve.core.horizon import GrowingScore
from br_serve.core.policies.br0 import ScalarScorer
from br_serve.core.tick import PoolCursor, _best_single
from br_serve.core.timecost import TimeScorer


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
