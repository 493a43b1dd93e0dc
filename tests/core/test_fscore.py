"""F-score against its definition: F_g(Q) = -dI, computed by brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core.fscore import (
    HorizonScore,
    discount_weights,
    f_score,
    horizon_points,
    imbalance_tokens,
    point_weights,
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


def _running(data: st.DataObject, g: int, h: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Up to 20 requests on ``g`` replicas: replica, weight and end step (some past
    ``h``, the window's last step)."""
    n = data.draw(st.integers(0, 20))
    rep = np.array(data.draw(st.lists(st.integers(0, g - 1), min_size=n, max_size=n)),
                   dtype=np.int64)
    w = np.array(data.draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)),
                 dtype=np.int64)
    end = np.array(data.draw(st.lists(st.integers(0, h + 5), min_size=n, max_size=n)),
                   dtype=np.int64)
    return rep, w, end


@given(data=st.data())
def test_projected_loads_match_brute_force(data: st.DataObject) -> None:
    g = data.draw(st.integers(1, 5))
    h = data.draw(st.integers(0, 12))
    rep, w, end = _running(data, g, h)
    got = projected_loads(rep, w, end, g, h)
    want = np.zeros((g, h + 1))
    for i in range(len(rep)):
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
    loads = np.array(proj, dtype=np.float64)
    width = loads.shape[1]
    _check_growing_score(data, loads, np.arange(width, dtype=np.float64),
                         discount_weights(width - 1, gamma), uniform=gamma == 1.0,
                         atol=1e-6)


def _check_growing_score(data: st.DataObject, loads: np.ndarray, h: np.ndarray,
                         wts: np.ndarray, uniform: bool, atol: float) -> None:
    """``GrowingScore`` of a random admission (replica, count, prompt total) equals
    ``-sum_k w_k dI(h_k)`` over ``loads`` (``(G, points)`` at steps ``h``)."""
    from br_serve.core.horizon import GrowingScore

    gsz = loads.shape[0]
    g = data.draw(st.integers(0, gsz - 1))
    n = data.draw(st.integers(1, 4))
    d = float(data.draw(st.integers(0, 2 * 10**5)))
    after = loads.copy()
    after[g] += d + n * h
    delta = np.array([imbalance_tokens(after[:, k]) - imbalance_tokens(loads[:, k])
                      for k in range(h.shape[0])])
    sc = GrowingScore(loads.max(axis=0) - loads[g], h, wts, 1.0, float(gsz),
                      uniform=uniform, dh=float(wts @ h))
    assert np.isclose(sc(d, n), -(wts @ delta), rtol=1e-9, atol=atol)


@given(horizon=st.integers(0, 5000), step=st.one_of(st.none(), st.integers(1, 400)),
       gamma=st.floats(0.9, 1.0))
def test_horizon_points_and_their_weights_cover_the_window(horizon: int, step: int | None,
                                                          gamma: float) -> None:
    """The ladder starts at 0, ends at H, ascends strictly; its weights sum to the whole
    window's discount, and on every step they are the discount weights themselves."""
    pts = horizon_points(horizon, step)
    assert pts[0] == 0 and pts[-1] == horizon
    assert (np.diff(pts) > 0).all()
    if step is None:
        assert np.array_equal(pts, np.arange(horizon + 1))
    w = point_weights(pts, gamma)
    whole = discount_weights(horizon, gamma)
    assert np.isclose(w.sum(), whole.sum(), rtol=1e-9)
    assert (w > 0).all()
    if step is None:
        assert np.allclose(w, whole, rtol=1e-9)


@given(data=st.data())
def test_projected_loads_at_points_are_the_dense_ones_read_there(data: st.DataObject) -> None:
    g = data.draw(st.integers(1, 5))
    h = data.draw(st.integers(0, 200))
    pts = horizon_points(h, data.draw(st.one_of(st.none(), st.integers(1, 30))))
    rep, w, end = _running(data, g, h)
    dense = projected_loads(rep, w, end, g, h)
    assert np.array_equal(projected_loads(rep, w, end, g, pts), dense[:, pts])
    assert np.array_equal(projected_loads(rep, w, None, g, pts),
                          projected_loads(rep, w, None, g, h)[:, pts])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), gamma=st.floats(0.5, 1.0))
def test_growing_score_on_a_ladder_is_minus_weighted_delta_imbalance(
        data: st.DataObject, gamma: float) -> None:
    """On a sparse ladder of points, BR-H's score is ``-sum_k w_k dI(h_k)`` with each
    point's weight and the admitted requests' growth ``D + n h_k``."""
    gsz = data.draw(st.integers(1, 6))
    pts = horizon_points(data.draw(st.integers(0, 3000)), data.draw(st.integers(1, 50)))
    h = pts.astype(np.float64)
    loads = np.array(data.draw(st.lists(
        st.lists(st.integers(0, 10**5), min_size=len(pts), max_size=len(pts)),
        min_size=gsz, max_size=gsz)), dtype=np.float64)
    wts = point_weights(pts, gamma)  # a point stands for up to H/2 steps: a wider atol
    _check_growing_score(data, loads, h, wts, uniform=False,
                         atol=1e-6 * max(1.0, float(wts.sum())))
