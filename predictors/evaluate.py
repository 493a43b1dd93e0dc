"""Evaluate predictors on a trace with the replay protocol and the time-ordered split.

Every predictor replays the whole trace and learns online from requests that finished
before each sample (survival and ExactMatch "train" by observing; the learned model's
feature state does the same). Metrics are computed on the test part only: samples of
requests that arrived after ``T_split`` (see :mod:`predictors.train`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from br_serve.core.predictor import TerminationPredictor
from br_serve.core.types import IntArray, RunningRequests
from predictors import make_predictor
from predictors.metrics import report
from predictors.replay import TraceLike, check_trace, replay, sample_grid
from predictors.train import time_split


def evaluate(trace: TraceLike, names: list[str], horizon: int, *, step_s: float = 0.08,
             train_frac: float = 0.7, model_path: str | None = None, seed: int = 0,
             source: str = "trace") -> list[dict[str, Any]]:
    """One metrics row per predictor name (see :func:`predictors.metrics.report`).

    Raises:
        ValueError: unknown predictor, ``exact`` on a trace without ``hash_ids``, or a
            trace that cannot be replayed (named).
    """
    check_trace(trace, source)
    if "exact" in names and trace.hash_ids is None:
        raise ValueError(f"{source}: has no hash_ids; the exact predictor needs prompt "
                         "prefix keys (use survival or learned on this trace)")
    preds: list[TerminationPredictor] = [
        make_predictor(n, horizon=horizon, model_path=model_path if n == "learned" else None,
                       seed=seed) for n in names]
    samples = sample_grid(trace, horizon, step_s)
    split = time_split(trace, samples, step_s, train_frac)
    p = np.zeros((len(names), len(samples)))
    mu = np.zeros((len(names), len(samples)))

    def probe(running: RunningRequests, rows: IntArray) -> None:
        for k, pr in enumerate(preds):
            ans = pr.predict(running, horizon)
            p[k, rows] = ans.p_fin
            mu[k, rows] = ans.mu_rem

    replay(trace, samples, step_s, preds, probe)
    test = split.test
    y = samples.labels(horizon)[test]
    rem = samples.remaining[test]
    rows = []
    for k, name in enumerate(names):
        row: dict[str, Any] = {"predictor": name, "horizon": horizon}
        row.update(report(y, p[k, test], rem, mu[k, test]))
        row.update({"test_requests": int(len(trace.arrival_s) - split.n_train_requests),
                    "split_s": split.split_s, "step_s": step_s})
        rows.append(row)
    return rows
