"""Metrics against hand computations; the replay never shows the future."""

from __future__ import annotations

import numpy as np
import pytest

from br_serve.core.predictor import FinishedRequests
from br_serve.core.types import IntArray, RunningRequests
from predictors.metrics import auc, brier, ece, mu_rem_mae, report
from predictors.replay import check_trace, replay, sample_grid
from predictors.train import time_split
from tests.predictors.synth import SynthTrace, family_trace


def test_auc_hand_computed_with_ties() -> None:
    # positives {0.9, 0.5}, negatives {0.5, 0.1}: pairs (0.9>0.5, 0.9>0.1, 0.5=0.5, 0.5>0.1)
    assert auc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == pytest.approx(3.5 / 4)
    assert auc([1, 0], [0.2, 0.8]) == 0.0
    assert np.isnan(auc([1, 1], [0.2, 0.8]))


def test_brier_ece_mae_hand_computed() -> None:
    y = np.array([1, 0, 1, 0])
    p = np.array([0.8, 0.2, 0.35, 0.35])
    assert brier(y, p) == pytest.approx((0.04 + 0.04 + 0.4225 + 0.1225) / 4)
    # bins: 0.2 -> bin 2 (y 0), 0.35 x2 -> bin 3 (y mean 0.5), 0.8 -> bin 8 (y 1)
    assert ece(y, p) == pytest.approx((0.2 + 2 * 0.15 + 0.2) / 4)
    assert mu_rem_mae([3, 50, 7, 9], [5, 0, 4, 0], [True, False, True, False]) == 2.5
    row = report(y, p, [3, 50, 7, 9], [5, 0, 4, 0])
    assert row["n_samples"] == 4 and row["positive_rate"] == 0.5
    with pytest.raises(ValueError, match="differ"):
        brier([1, 0], [0.5])


def test_sample_grid_every_half_horizon_while_running() -> None:
    tr = SynthTrace(np.array([0.0, 1.0]), np.array([5, 5]), np.array([1, 45]), None)
    s = sample_grid(tr, 20, step_s=0.1)
    got = sorted(zip(s.request.tolist(), s.decoded.tolist(), s.remaining.tolist(),
                     strict=True))
    assert got == [(0, 0, 1), (1, 0, 45), (1, 10, 35), (1, 20, 25), (1, 30, 15), (1, 40, 5)]
    assert (np.diff(s.time_s) >= 0).all()
    assert s.labels(20).tolist() == (s.remaining <= 20).tolist()


class Spy:
    """Records what it was told and checks it against the sample times it answers."""

    def __init__(self, trace: SynthTrace, step_s: float) -> None:
        self.finish = trace.arrival_s + trace.output_tokens * step_s
        self.seen_finish: list[float] = []
        self.checked = 0

    def observe(self, finished: FinishedRequests) -> None:
        self.seen_finish.extend(finished.finish_s.tolist())

    def probe(self, running: RunningRequests, rows: IntArray, t: np.ndarray) -> None:
        latest = max(self.seen_finish, default=-1.0)
        now = t[rows]
        assert latest <= now.min() + 1e-12  # nothing from the future
        # ...and everything that finished by then has been observed
        assert len(self.seen_finish) == int((self.finish <= now.min() + 1e-12).sum())
        self.checked += len(rows)


def test_replay_shows_exactly_the_past() -> None:
    tr = family_trace(200, seed=1, with_hash_ids=False)
    s = sample_grid(tr, 16, 0.05)
    spy = Spy(tr, 0.05)
    replay(tr, s, 0.05, [spy], lambda r, rows: spy.probe(r, rows, s.time_s))
    assert spy.checked == len(s)


def test_time_split_trains_only_on_requests_finished_before_the_split() -> None:
    tr = family_trace(300, seed=2)
    s = sample_grid(tr, 20, 0.08)
    sp = time_split(tr, s, 0.08, 0.7)
    fin = tr.arrival_s + tr.output_tokens * 0.08
    assert sp.n_train_requests == 210
    assert (s.request[sp.test] >= 210).all()
    assert (fin[s.request[sp.train]] <= sp.split_s).all()
    assert not (sp.train & sp.test).any()
    with pytest.raises(ValueError, match="train_frac"):
        time_split(tr, s, 0.08, 1.0)


def test_check_trace_names_missing_fields() -> None:
    class NoOutputs:
        arrival_s = np.zeros(3)
        input_tokens = np.ones(3, np.int64)
        output_tokens = None
        hash_ids = None

    with pytest.raises(ValueError, match="output_tokens"):
        check_trace(NoOutputs(), "x.csv")  # type: ignore[arg-type]


def test_platt_scaling_recovers_known_coefficients() -> None:
    from predictors.train import platt

    rng = np.random.default_rng(0)
    x = rng.normal(0, 2, 40000)
    y = (rng.random(x.size) < 1 / (1 + np.exp(-(2.0 * x - 1.0)))).astype(np.float64)
    a, b = platt(x, y)
    assert a == pytest.approx(2.0, abs=0.1)
    assert b == pytest.approx(-1.0, abs=0.1)
