"""BR-H's refill projection against a brute-force, step-by-step rollout."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core.fscore import f_score, projected_loads
from br_serve.core.projection import Refill, refill_arrays, refill_rollout


def _brute(replica: list[int], weight: list[int], end: list[int], alive: list[bool],
           horizon: int, sizes: list[int], cap: int | None
           ) -> tuple[list[Refill], np.ndarray]:
    """Step by step: at step h the requests ending at h leave, then each freed slot (in
    replica order) takes BR-0's Stage 1 choice for its margin at h, from what is left."""
    g = len(alive)
    # (replica, weight, start, end): the request's load is weight + (h - start) on
    # [start, end); the running ones start at 0, refills at their step
    live = [(r, float(w), 0, e) for r, w, e in zip(replica, weight, end, strict=True)]
    left = sorted(sizes)
    budget = len(left) if cap is None else min(cap, len(left))
    alive_g = max(1, sum(alive))
    out: list[Refill] = []

    def load_at(h: int, rows: list[tuple[int, float, int, int]]) -> list[float]:
        tot = [0.0] * g
        for r, w, s0, e in rows:
            if s0 <= h < e:
                tot[r] += w + (h - s0)
        return tot

    for h in range(horizon + 1):
        freed = sorted(r for r, _, s0, e in live if s0 == 0 and max(0, e) == h)
        for r in freed:
            if budget == 0 or not left or not alive[r]:
                continue
            tot = load_at(h, live)
            top = max((tot[k] for k in range(g) if alive[k]), default=0.0)
            m = top - tot[r]
            below = [x for x in left if x <= m]
            above = [x for x in left if x > m]
            opts = ([max(below)] if below else []) + ([min(above)] if above else [])
            best = max(opts, key=lambda x: (f_score(float(x), m, alive_g), -x))
            left.remove(best)
            budget -= 1
            out.append(Refill(h, r, best))
            live.append((r, float(best), h, horizon + 10))
    loads = np.zeros((g, horizon + 1))
    for h in range(horizon + 1):
        loads[:, h] = load_at(h, live)
    return out, loads


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), g=st.integers(1, 5), horizon=st.integers(0, 12),
       n_pool=st.integers(0, 12), cap=st.sampled_from([None, 0, 1, 3]))
def test_rollout_matches_brute_force(seed: int, g: int, horizon: int, n_pool: int,
                                     cap: int | None) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3 * g + 1))
    replica = rng.integers(0, g, n)
    weight = rng.integers(0, 400, n)
    end = rng.integers(0, horizon + 3, n)  # some survive (> horizon)
    alive = (rng.random(g) > 0.2).tolist()
    sizes = sorted(rng.integers(0, 500, n_pool).tolist())
    got = refill_rollout(replica, weight, end, alive, horizon, sizes, cap)
    want, want_loads = _brute(replica.tolist(), weight.tolist(), end.tolist(), alive,
                              horizon, sizes, cap)
    assert got == want
    loads, prompts, counts, first = refill_arrays(got, g, horizon)
    total = projected_loads(replica, weight, end, g, horizon) + loads
    np.testing.assert_allclose(total, want_loads)
    for r in range(g):
        mine = [f for f in got if f.replica == r]
        assert first[r] == (min(f.step for f in mine) if mine else horizon + 1)
        for h in range(horizon + 1):
            assert prompts[r, h] == sum(f.prompt_tokens for f in mine if f.step <= h)
            assert counts[r, h] == sum(1 for f in mine if f.step <= h)


def test_refill_by_hand() -> None:
    # Replica 0: a 1,000-token request ending at step 2; replica 1: 900 tokens, lives.
    # At step 2 replica 1 holds 902, replica 0 nothing: margin 902, so the largest
    # prompt within it (800) refills replica 0 (1,200 overflows: F = 1200 - 2*298 < 800).
    refills = refill_rollout(np.array([0, 1]), np.array([1000, 900]), np.array([2, 9]),
                             [True, True], 4, [100, 800, 1200])
    assert refills == [Refill(2, 0, 800)]
    loads, prompts, _, first = refill_arrays(refills, 2, 4)
    np.testing.assert_array_equal(loads[0], [0, 0, 800, 801, 802])
    np.testing.assert_array_equal(prompts[0], [0, 0, 800, 800, 800])
    assert first == [2, 5]
    # An empty pool refills nothing: the slot stays empty (a shallow pool).
    assert refill_rollout(np.array([0]), np.array([5]), np.array([1]), [True], 4, []) == []
