"""The t-interval arithmetic and the perturbed replays (pure, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.sim.replays import make_replays
from br_serve.sim.stats import betainc, paired, t_cdf, t_quantile
from br_serve.traces import Trace

# two-sided 95% critical values of Student's t (printed tables, 4 decimals)
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 7: 2.3646, 9: 2.2622,
        10: 2.2281, 15: 2.1314, 20: 2.0860, 30: 2.0423, 60: 2.0003, 120: 1.9799}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_tables(df: int) -> None:
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=6e-5)
    assert t_quantile(0.025, df) == pytest.approx(-T975[df], abs=6e-5)


def test_t_cdf_and_betainc_known_values() -> None:
    assert t_cdf(0.0, 3) == pytest.approx(0.5, abs=1e-15)
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/pi
    for t in (-3.0, -0.5, 0.7, 10.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    # I_x(1, 1) = x; I_x(a, 1) = x^a
    assert betainc(1, 1, 0.3) == pytest.approx(0.3, abs=1e-14)
    assert betainc(2.5, 1, 0.4) == pytest.approx(0.4 ** 2.5, abs=1e-13)
    # a large df approaches the normal quantile
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    with pytest.raises(ValueError, match="t_quantile"):
        t_quantile(1.0, 3)


def test_paired_statistics() -> None:
    st0 = paired([0.0, 0.0, 0.0, 0.0])
    assert (st0.mean, st0.se, st0.ci95, st0.tie) == (0.0, 0.0, (0.0, 0.0), True)
    vals = [0.2, 0.3, 0.4, 0.5]
    st1 = paired(vals)
    sd = float(np.std(vals, ddof=1))
    assert st1.mean == pytest.approx(0.35)
    assert st1.se == pytest.approx(sd / 2)
    assert st1.ci95 == pytest.approx((0.35 - 3.1824 * sd / 2, 0.35 + 3.1824 * sd / 2),
                                     abs=1e-4)
    assert not st1.tie  # (0.145, 0.555)
    assert paired([0.1, 0.2, 0.3, 0.6]).tie  # (-0.044, 0.644) holds 0
    one = paired([0.05])
    assert one.se is None and one.ci95 is None and one.tie
    # The JSON form the benches write: a list interval, None without spread.
    assert st1.as_dict() == {"mean": st1.mean, "ci95": list(st1.ci95 or ()), "n": 4}
    assert one.as_dict() == {"mean": 0.05, "ci95": None, "n": 1}
    with pytest.raises(ValueError, match="no values"):
        paired([])
    with pytest.raises(ValueError, match="non-finite"):
        paired([1.0, math.nan])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=2, max_size=20))
def test_interval_holds_its_mean_and_scales(xs: list[float]) -> None:
    a = paired(xs)
    assert a.ci95 is not None and a.se is not None
    assert a.ci95[0] <= a.mean <= a.ci95[1]
    b = paired([2 * x for x in xs])  # the interval is equivariant under scaling
    assert b.ci95 is not None
    assert b.ci95[0] == pytest.approx(2 * a.ci95[0], abs=1e-9)
    assert b.ci95[1] == pytest.approx(2 * a.ci95[1], abs=1e-9)


def _trace(n: int = 100) -> Trace:
    rng = np.random.default_rng(1)
    return Trace.build(np.cumsum(rng.exponential(0.5, n)), rng.integers(1, 500, n),
                       rng.integers(1, 90, n), source="unit")


def test_window_replays_are_strata_and_seeded() -> None:
    tr = _trace(100)
    reps = make_replays(tr, "window", 4, limit=20, seed=7)
    assert [r.index for r in reps] == [0, 1, 2, 3]
    assert [r.seed for r in reps] == [7, 8, 9, 10]
    span = 100 - 20 + 1
    for r in reps:  # replay r starts inside stratum r of the 81 admissible starts
        assert r.index * span // 4 <= r.start < (r.index + 1) * span // 4
        assert len(r.trace) == 20
        assert np.array_equal(r.trace.output_tokens, tr.output_tokens[r.start:r.start + 20])
        assert r.trace.arrival_s[0] == 0.0
    again = make_replays(tr, "window", 4, limit=20, seed=7)
    assert [r.start for r in again] == [r.start for r in reps]
    # a replay does not depend on how many others there are
    assert make_replays(tr, "window", 8, limit=20, seed=7)[0].seed == 7
    other = make_replays(tr, "window", 4, limit=20, seed=8)
    assert [r.start for r in other] != [r.start for r in reps]


def test_jitter_and_seed_replays() -> None:
    tr = _trace(50)
    reps = make_replays(tr, "jitter", 3, limit=30, jitter_ms=200.0, seed=0)
    for r in reps:
        assert len(r.trace) == 30
        assert sorted(r.trace.output_tokens.tolist()) == sorted(
            tr.output_tokens[:30].tolist())
        assert (np.diff(r.trace.arrival_s) >= 0).all()
        assert not np.array_equal(r.trace.arrival_s, tr.arrival_s[:30])
    assert not np.array_equal(reps[0].trace.arrival_s, reps[1].trace.arrival_s)
    same = make_replays(tr, "seed", 3, seed=5)
    assert all(r.trace is same[0].trace for r in same)
    assert [r.seed for r in same] == [5, 6, 7]
    (one,) = make_replays(tr, "none", 1, limit=10)
    assert len(one.trace) == 10 and one.seed == 0


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(mode="window", replays=0, limit=10), "replays"),
    (dict(mode="windows", replays=2, limit=10), "replay_mode"),
    (dict(mode="window", replays=2, limit=101), "limit"),
    (dict(mode="window", replays=2, limit=None), "limit"),
    (dict(mode="jitter", replays=2, limit=10), "jitter_ms"),
    (dict(mode="none", replays=2, limit=10), "replays"),
])
def test_bad_replay_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        make_replays(_trace(100), kwargs["mode"], kwargs["replays"],  # type: ignore[arg-type]
                     limit=kwargs["limit"])  # type: ignore[arg-type]
