"""Every predictor honours the core's contract on arbitrary batches and histories."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core.predictor import TerminationPredictor, validate_prediction
from br_serve.core.types import RunningRequests
from predictors import finished_requests, make_predictor, warm_start

hash_row = st.one_of(st.none(), st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple))


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, tuple[int, ...] | None]],
                                      list[tuple[int, int, tuple[int, ...] | None]]]:
    history = draw(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 400), hash_row),
                            max_size=60))
    running = draw(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 500),
                                      st.integers(-1, 3), hash_row), max_size=30))
    return running, history


def _build(name: str, history: list[tuple[int, int, tuple[int, ...] | None]]
           ) -> TerminationPredictor:
    opts = {"survival": {"min_samples": 1}} if name == "exact" else (
        {"min_samples": 1, "prompt_buckets": (1000, 3000), "min_bucket_samples": 2}
        if name == "survival" else {})
    pred = make_predictor(name, horizon=40, **opts)
    if history:
        warm_start(pred, [h[0] for h in history], [h[1] for h in history],
                   hash_ids=[h[2] for h in history])
    return pred


@pytest.mark.parametrize("name", ["survival", "exact", "survives"])
@settings(max_examples=40, deadline=None)
@given(data=batches(), horizon=st.integers(0, 120))
def test_predictions_are_valid_and_consistent(name: str, data: tuple[list, list],  # type: ignore[type-arg]
                                             horizon: int) -> None:
    running, history = data
    pred = _build(name, history)
    n = len(running)
    r = RunningRequests.build(np.zeros(n, np.int64), [x[0] for x in running],
                              [x[1] for x in running], prefix_hash=[x[2] for x in running],
                              request_ids=tuple(str(j) for j in range(n)),
                              hash_ids=tuple(x[3] for x in running))
    ans = pred.predict(r, horizon)
    validate_prediction(ans, n)
    fin = ans.p_fin > 0
    # a finisher's mean remaining lies inside the window
    assert ((ans.mu_rem[fin] >= 1) & (ans.mu_rem[fin] <= max(horizon, 0) + 1e-9)).all()
    # a longer window can only make finishing more likely (survival/exact are CDFs)
    wider = pred.predict(r, horizon + 10)
    assert (wider.p_fin >= ans.p_fin - 1e-12).all()


def test_finished_requests_validates_lengths() -> None:
    with pytest.raises(ValueError, match="output_tokens"):
        finished_requests([1, 2], [3])
    with pytest.raises(ValueError, match="hash_ids"):
        finished_requests([1, 2], [3, 4], hash_ids=[(1,)])
