"""Survival and ExactMatch answers checked against hand-computed distributions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predictors import finished_requests, make_predictor, predictor_names, warm_start
from predictors.store import SampleMemory, SegmentedSamples
from tests.predictors.conftest import running

#: the window predictors are built for (the policy's horizon; only learned checks it)
H = 80


def test_survival_matches_hand_computed_distribution() -> None:
    # Samples {10, 20, 30, 200}. For a=15, H=20: alive {20, 30, 200}, finishing in
    # (15, 35] = {20, 30}: p = 2/3, mu = mean(20, 30) - 15 = 10.
    p = make_predictor("survival", horizon=H, min_samples=1)
    warm_start(p, [7] * 4, [10, 20, 30, 200])
    pred = p.predict(running([5, 5, 5, 5], [0, 15, 100, 200]), 20)
    np.testing.assert_allclose(pred.p_fin, [2 / 4, 2 / 3, 0.0, 0.0])
    np.testing.assert_allclose(pred.mu_rem, [15.0, 10.0, 20.0, 20.0])


def test_survival_window_boundaries_are_inclusive_of_a_plus_h() -> None:
    # o - a <= H finishes inside the window: o = a + H counts, o = a does not.
    p = make_predictor("survival", horizon=H, min_samples=1)
    warm_start(p, [1, 1, 1], [5, 25, 26])
    pred = p.predict(running([1], [5]), 20)
    np.testing.assert_allclose(pred.p_fin, [0.5])  # alive {25, 26}; 25 <= 25 finishes
    np.testing.assert_allclose(pred.mu_rem, [20.0])


def test_survival_without_history_is_the_closed_gate() -> None:
    p = make_predictor("survival", horizon=H)  # min_samples=16
    warm_start(p, [1] * 15, [3] * 15)
    pred = p.predict(running([1, 2], [0, 0]), 80)
    assert (pred.p_fin == 0).all()
    assert (pred.mu_rem == 80).all()


def test_survival_sliding_window_forgets_old_samples() -> None:
    p = make_predictor("survival", horizon=H, min_samples=1, max_samples=2)
    warm_start(p, [1, 1, 1], [10, 1000, 1000])  # 10 falls out of the window
    assert p.predict(running([1], [0]), 50).p_fin[0] == 0.0
    warm_start(p, [1], [10])
    np.testing.assert_allclose(p.predict(running([1], [0]), 50).p_fin, [0.5])


def test_survival_reservoir_is_bounded_and_seeded() -> None:
    outs = np.arange(1, 1001)
    answers = []
    for _ in range(2):
        p = make_predictor("survival", horizon=H, memory="reservoir", max_samples=50, seed=3,
                           min_samples=1)
        warm_start(p, np.ones(1000, np.int64), outs)
        assert p.num_samples == 50  # type: ignore[attr-defined]
        answers.append(p.predict(running([1], [0]), 300).p_fin[0])
    assert answers[0] == answers[1]
    assert 0.05 < answers[0] < 0.7  # a uniform sample of 1..1000: about 0.3


def test_survival_prompt_buckets_fall_back_to_global_when_small() -> None:
    p = make_predictor("survival", horizon=H,
                       min_samples=1, prompt_buckets=(100,), min_bucket_samples=2)
    # short prompts end at 10, long prompts at 500
    warm_start(p, [10, 20, 500, 600], [10, 10, 500, 500])
    pred = p.predict(running([50, 5000], [0, 0]), 20)
    np.testing.assert_allclose(pred.p_fin, [1.0, 0.0])
    p2 = make_predictor("survival", horizon=H,
                        min_samples=1, prompt_buckets=(100,), min_bucket_samples=3)
    warm_start(p2, [10, 20, 500, 600], [10, 10, 500, 500])
    np.testing.assert_allclose(p2.predict(running([50], [0]), 20).p_fin, [0.5])


def test_exact_hits_reuse_the_key_and_misses_fall_back() -> None:
    p = make_predictor("exact", horizon=H,
                       prefix_blocks=2, prior_weight=0, survival={"min_samples": 1})
    warm_start(p, [1, 1, 1, 1], [50, 60, 500, 5],
               hash_ids=[(0, 1, 2), (0, 1, 3), (0, 2), (0, 3)])
    batch = running([1, 1, 1, 1, 1], [0, 55, 0, 0, 61],
                    hash_ids=[(0, 1, 9), (0, 1), (0, 2, 4), (7, 7), (0, 1, 2)])
    pred = p.predict(batch, 20)
    surv = p.fallback.predict(batch, 20)  # type: ignore[attr-defined]
    # row 0: key (0,1) = {50, 60}, neither within 20 steps of a=0
    # row 1: key (0,1), a=55: alive {60}, finishes -> p=1, mu=5
    # row 2: key (0,2) = {500}: p=0
    # row 3: unseen key -> survival over {5, 50, 60, 500}: p = 1/4, mu = 5
    # row 4: key (0,1) but a=61 outlived both samples -> survival (alive {500}: p=0)
    np.testing.assert_allclose(pred.p_fin, [0.0, 1.0, 0.0, 0.25, 0.0])
    np.testing.assert_allclose(pred.mu_rem, [20.0, 5.0, 20.0, 5.0, 20.0])
    np.testing.assert_allclose(pred.p_fin[[3, 4]], surv.p_fin[[3, 4]])


def test_exact_shrinks_small_keys_toward_survival() -> None:
    # key (0,1) = {50, 60}; survival = {5, 50, 60, 500}; a=0, H=20, w=2:
    # p = (2 * 0 + 2 * 1/4) / (2 + 2) = 1/8; only survival finishers -> mu = 5.
    # a=55: key alive {60} finishes (p=1, mu=5), survival alive {60, 500}: p=1/2, mu=5
    # -> p = (1 * 1 + 2 * 1/2) / 3 = 2/3, mu = (1*5 + 1*5) / 2 = 5.
    p = make_predictor("exact", horizon=H, prior_weight=2, survival={"min_samples": 1})
    warm_start(p, [1] * 4, [50, 60, 500, 5], hash_ids=[(0, 1), (0, 1, 3), (0, 2), (0, 3)])
    pred = p.predict(running([1, 1], [0, 55], hash_ids=[(0, 1, 7), (0, 1)]), 20)
    np.testing.assert_allclose(pred.p_fin, [1 / 8, 2 / 3])
    np.testing.assert_allclose(pred.mu_rem, [5.0, 5.0])


def test_exact_uses_prefix_hash_without_hash_ids_and_evicts_old_keys() -> None:
    p = make_predictor("exact", horizon=H, max_keys=1, per_key_samples=2, prior_weight=0)
    p.observe(finished_requests([1, 1, 1], [30, 31, 32], prefix_hash=[7, 7, 7]))
    pred = p.predict(running([1], [29], prefix_hash=[7]), 2)
    np.testing.assert_allclose(pred.p_fin, [0.5])  # only the latest two: {31, 32}
    p.observe(finished_requests([1], [900], prefix_hash=[8]))  # evicts key 7
    assert p.num_keys == 1  # type: ignore[attr-defined]
    assert p.predict(running([1], [29], prefix_hash=[7]), 2).p_fin[0] == 0.0


def test_unknown_name_and_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"^predictor: unknown 'nope'.*survival"):
        make_predictor("nope", horizon=H)
    with pytest.raises(ValueError, match=r"survival\.max_samples"):
        make_predictor("survival", horizon=H, max_samples=0)
    with pytest.raises(ValueError, match=r"exact\.bogus"):
        make_predictor("exact", horizon=H, bogus=1)
    with pytest.raises(ValueError, match="needs model_path"):
        make_predictor("learned", horizon=H)
    assert set(predictor_names()) == {"survives", "survival", "exact", "oracle", "learned"}


def test_oracle_reads_true_remaining_and_refuses_without_it() -> None:
    from br_serve.core.types import RunningRequests

    p = make_predictor("oracle", horizon=H)
    r = RunningRequests.build([0, 0], [1, 1], [0, 0], true_remaining_steps=[3, 90])
    pred = p.predict(r, 80)
    np.testing.assert_allclose(pred.p_fin, [1.0, 0.0])
    assert pred.mu_rem[0] == 3
    with pytest.raises(ValueError, match="true_remaining_steps"):
        p.predict(running([1], [0]), 80)


def _brute(samples: list[tuple[int, int]], seg: int, a: int, h: int) -> tuple[float, float]:
    vals = [v for s, v in samples if s == seg and v > a]
    fin = [v for v in vals if v <= a + h]
    p = len(fin) / len(vals) if vals else 0.0
    mu = float(np.mean(fin)) - a if fin else float(h)
    return p, mu


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=40),
       st.lists(st.integers(0, 39), max_size=15),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 70)), min_size=1, max_size=8),
       st.integers(0, 30))
def test_store_matches_brute_force(adds: list[tuple[int, int]], drops: list[int],
                                   queries: list[tuple[int, int]], h: int) -> None:
    store = SegmentedSamples()
    for s, v in adds:
        store.add(s, v)
    kept = list(adds)
    for d in sorted(set(drops), reverse=True):
        if d < len(kept):
            s, v = kept.pop(d)
            store.remove(s, v)
    segs = np.array([q[0] for q in queries])
    ages = np.array([q[1] for q in queries])
    ans = store.query(segs, ages, h)
    for j, (s, a) in enumerate(queries):
        p, mu = _brute(kept, s, a, h)
        assert ans.p_fin[j] == pytest.approx(p)
        assert ans.mu_rem[j] == pytest.approx(mu)
        assert store.count(s) == sum(1 for x in kept if x[0] == s)
    # the tick's fast path answers the same, mixed segments or one for all
    for sg in (segs, np.full_like(segs, segs[0])):
        full = store.query(sg, ages, h)
        p_fin, mu_rem = store.query_fin(sg, ages, h)
        assert np.array_equal(p_fin, full.p_fin) and np.array_equal(mu_rem, full.mu_rem)


def test_store_rejects_removing_absent_value() -> None:
    store = SegmentedSamples()
    store.add(0, 5)
    store.remove(0, 6)
    with pytest.raises(KeyError):
        store.query(np.array([0]), np.array([0]), 1)


def test_window_memory_reports_evictions() -> None:
    mem = SampleMemory("window", 2, np.random.default_rng(0))
    assert mem.offer(1) == (True, None)
    assert mem.offer(2) == (True, None)
    assert mem.offer(3) == (True, 1)
    assert mem.values() == [2, 3]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), buckets=st.integers(2, 8), after=st.integers(8, 120),
       batch=st.integers(1, 50))
def test_auto_buckets_are_refitted_and_answer_as_explicit_edges(
        seed: int, buckets: int, after: int, batch: int) -> None:
    """Auto buckets: every ``auto_bucket_after`` finished requests the edges are refitted
    at the equal-count quantiles of the recent requests' prompts, and the predictor then
    answers exactly as one configured with those edges from the start, fed the same
    history (the memory holds it all here)."""
    from predictors.survival import quantile_edges

    rng = np.random.default_rng(seed)
    n = after + 4 * batch
    prompts = rng.lognormal(4.0, 1.5, n).astype(np.int64) + 1
    outputs = rng.integers(1, 3000, n)
    auto = make_predictor("survival", horizon=H, auto_buckets=buckets, auto_bucket_after=after,
                          min_samples=1, min_bucket_samples=4)
    fed, since = 0, 0
    edges: tuple[int, ...] = ()
    while fed < n:  # in batches, as finishes arrive
        k = min(batch, n - fed)
        warm_start(auto, prompts[fed:fed + k], outputs[fed:fed + k])
        fed += k
        since += k
        if since >= after:  # a refit, on everything seen so far (< max_samples)
            since = 0
            edges = quantile_edges(prompts[:fed], buckets)
    assert auto.edges == edges  # type: ignore[attr-defined]
    assert len(edges) <= buckets - 1 and all(e > 0 for e in edges)
    fixed = (make_predictor("survival", horizon=H, prompt_buckets=edges, min_samples=1,
                            min_bucket_samples=4) if edges
             else make_predictor("survival", horizon=H, min_samples=1))
    warm_start(fixed, prompts, outputs)
    k = min(20, n)
    probe = running(prompts[:k].tolist(), rng.integers(0, 2000, k).tolist())
    a, b = auto.predict(probe, 400), fixed.predict(probe, 400)
    np.testing.assert_array_equal(a.p_fin, b.p_fin)
    np.testing.assert_array_equal(a.mu_rem, b.mu_rem)


def test_auto_buckets_wait_for_history_and_refuse_explicit_edges() -> None:
    p = make_predictor("survival", horizon=H, auto_buckets=4, auto_bucket_after=10, min_samples=1)
    warm_start(p, [5, 50, 500, 5000] * 2, [10, 20, 30, 40] * 2)
    assert p.edges == ()  # type: ignore[attr-defined]  # 8 of 10 seen: no buckets yet
    warm_start(p, [5, 5000], [10, 40])
    assert p.edges == (50, 500, 5000)  # type: ignore[attr-defined]  # 3 / 2 / 2 / 3
    with pytest.raises(ValueError, match="auto_buckets"):
        make_predictor("survival", horizon=H, auto_buckets=4, prompt_buckets=(10,))
