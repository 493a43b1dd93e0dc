"""F-score against its definition: F_g(Q) = -dI, computed by brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core.fscore import (
    HorizonScore,
    discount_weights,
    f_score,
    imbalance_tokens,
    projected_loads,
)

loads_st = st.lists(st.integers(0, 10**6), min_size=1, max_size=32)


@given(loads=loads_st, data=st.data())
def test_br0_score_is_minus_delta_imbalance(loads: list[int], data: st.DataObject) -> None:
    g = data.draw(st.integers(0, len(loads) - 1))
    d = data.draw(st.integers(0, 10**6))
    before = imbalance_tokens(loads)
    after_loads = list(loads)
    after_loads[g] += d
    delta = imbalance_tokens(after_loads) - before
    assert f_score(d, max(loads) - loads[g], len(loads)) == -delta

#: (G, H+1) projected loads: up to 6 replicas, equal horizon widths up to 12.
_PROJECTED_LOADS = st.lists(
    st.lists(st.integers(0, 10**5), min_size=1, max_size=12), min_size=1, max_size=6,
).filter(lambda r: len({len(x) for x in r}) == 1)


def test_br0_score_hand_values() -> None:
    # G=4, margin 100: slope +1 up to 100, then -(G-1) = -3.
    assert f_score(60, 100, 4) == 60
    assert f_score(100, 100, 4) == 100
    assert f_score(110, 100, 4) == 110 - 4 * 10
    assert f_score(200, 0, 4) == -600


@settings(max_examples=200, deadline=None)
@given(proj=_PROJECTED_LOADS, gamma=st.floats(0.5, 1.0), data=st.data())
def test_horizon_score_is_minus_discounted_delta_imbalance(proj: list[list[int]], gamma: float,
                                                           data: st.DataObject) -> None:
    """With alpha=1, beta=G: F = -sum_h d_h * dI(h) over the projected loads."""
    loads = np.array(proj, dtype=np.float64)  # (G, H+1)
    gsz, width = loads.shape
    d_w = discount_weights(width - 1, gamma)
    g = data.draw(st.integers(0, gsz - 1))
    d = float(data.draw(st.integers(0, 2 * 10**5)))
    top = loads.max(axis=0)
    after = loads.copy()
    after[g] += d
    delta = np.array([imbalance_tokens(after[:, h]) - imbalance_tokens(loads[:, h])
                      for h in range(width)])
    sc = HorizonScore(top - loads[g], d_w, 1.0, float(gsz))
    assert np.isclose(sc(d), -(d_w @ delta), rtol=1e-9, atol=1e-6)
    assert np.isclose(sc.many(np.array([d]))[0], sc(d), rtol=1e-12, atol=1e-9)
    if gamma == 1.0:
        fast = HorizonScore(top - loads[g], d_w, 1.0, float(gsz), uniform=True)
        assert np.isclose(fast(d), sc(d), rtol=1e-12, atol=1e-6) and fast.peak == sc.peak


@given(
    margins=st.lists(st.integers(0, 1000), min_size=1, max_size=20),
    alpha=st.floats(0.1, 3.0),
    beta=st.floats(0.1, 20.0),
)
def test_horizon_peak_maximises_score(margins: list[int], alpha: float, beta: float) -> None:
    m = np.array(margins, dtype=np.float64)
    d = np.ones_like(m)
    sc = HorizonScore(m, d, alpha, beta)
    fast = HorizonScore(m, d, alpha, beta, uniform=True)
    assert fast.peak == sc.peak
    grid = np.arange(0, 1200, 0.5)
    best = sc.many(grid).max()
    if np.isinf(sc.peak):
        assert beta * d.sum() <= alpha * d.sum() + 1e-9  # slope never turns negative
    else:
        assert sc(sc.peak) >= best - 1e-6 * max(1.0, abs(best))


@given(data=st.data())
def test_projected_loads_match_brute_force(data: st.DataObject) -> None:
    g = data.draw(st.integers(1, 5))
    h = data.draw(st.integers(0, 12))
    n = data.draw(st.integers(0, 20))
    rep = np.array(data.draw(st.lists(st.integers(0, g - 1), min_size=n, max_size=n)),
                   dtype=np.int64)
    w = np.array(data.draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)),
                 dtype=np.int64)
    end = np.array(data.draw(st.lists(st.integers(0, h + 5), min_size=n, max_size=n)),
                   dtype=np.int64)
    got = projected_loads(rep, w, end, g, h)
    want = np.zeros((g, h + 1))
    for i in range(n):
        for step in range(h + 1):
            if step < end[i]:
                want[rep[i], step] += w[i] + step
    assert np.array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(proj=_PROJECTED_LOADS, gamma=st.floats(0.5, 1.0), data=st.data())
def test_growing_score_is_minus_discounted_delta_imbalance(proj: list[list[int]],
                                                           gamma: float,
                                                           data: st.DataObject) -> None:
    """BR-H's score for n admitted requests counts their growth: load D + n*h at step h."""
    from br_serve.core.policies.brh import GrowingScore

    loads = np.array(proj, dtype=np.float64)
    gsz, width = loads.shape
    h = np.arange(width, dtype=np.float64)
    d_w = discount_weights(width - 1, gamma)
    g = data.draw(st.integers(0, gsz - 1))
    n = data.draw(st.integers(1, 4))
    d = float(data.draw(st.integers(0, 2 * 10**5)))
    after = loads.copy()
    after[g] += d + n * h
    delta = np.array([imbalance_tokens(after[:, k]) - imbalance_tokens(loads[:, k])
                      for k in range(width)])
    sc = GrowingScore(loads.max(axis=0) - loads[g], h, d_w, 1.0, float(gsz),
                      uniform=gamma == 1.0, dh=float(d_w @ h))
    assert np.isclose(sc(d, n), -(d_w @ delta), rtol=1e-9, atol=1e-6)
