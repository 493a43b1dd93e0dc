"""The predictors as BR-H sees them: the confidence gate and failure fallback.

Uses the core's ``brh`` policy unchanged (``build_policy`` with an injected clock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from br_serve.core import (
    ClusterSnapshot,
    PolicyContext,
    PoolRequest,
    PromptPool,
    RunningRequests,
    build_policy,
)
from br_serve.core.predictor import FinishedRequests, Prediction
from predictors import make_predictor, warm_start

H = 10


class Fixed:
    """Answers the same (p_fin, mu_rem) for every running request."""

    name = "fixed"

    def __init__(self, p: float, mu: float) -> None:
        self.p, self.mu = p, mu

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        n = len(running)
        return Prediction(np.full(n, self.p), np.full(n, self.mu))

    def observe(self, finished: FinishedRequests) -> None:
        return None


class Raises(Fixed):
    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        raise RuntimeError("model server down")


class Slow(Fixed):
    """Answers correctly but the (fake) clock says it took a whole second."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__(1.0, 2.0)
        self.clock = clock

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        self.clock[0] += 1.0
        return super().predict(running, horizon_steps)


def _cluster() -> ClusterSnapshot:
    # replica 0: one request of 100 tokens; replica 1: one of 60 tokens.
    run = RunningRequests.build([0, 1], [90, 60], [10, 0], request_ids=("a", "b"))
    return ClusterSnapshot.build([100, 60], [1, 1], slots=2, running=run)


def _brh(predictor: object, clock: Callable[[], float] = lambda: 0.0) -> Any:
    return build_policy("brh", {"horizon": H, "horizon_step": None, "trust_decode_share": None},
                        PolicyContext(predictor=predictor, clock=clock))  # type: ignore[arg-type]


def _closed_loads() -> np.ndarray:
    h = np.arange(H + 1)
    return np.stack([100 + h, 60 + h]).astype(float)


def test_p_below_half_means_survives_the_window() -> None:
    proj = _brh(Fixed(0.49, 2.0)).projected(_cluster())
    loads, ok = proj.loads, proj.ok
    assert ok
    np.testing.assert_array_equal(loads, _closed_loads())


def test_p_at_or_above_half_ends_the_request_after_mu_steps() -> None:
    proj = _brh(Fixed(0.5, 3.0)).projected(_cluster())
    loads, ok = proj.loads, proj.ok
    assert ok
    expect = _closed_loads()
    expect[:, 3:] = 0.0  # both requests projected to end after 3 steps
    np.testing.assert_array_equal(loads, expect)


def test_survival_predictor_drives_the_gate() -> None:
    # History where 40% end within H of a=0: the gate stays closed.
    surv = make_predictor("survival", horizon=H, min_samples=1)
    warm_start(surv, [1] * 5, [5, 5, 500, 500, 500])
    proj = _brh(surv).projected(_cluster())
    # the predictor answered (a failure would also give the closed loads: check it)
    assert proj.ok
    np.testing.assert_array_equal(proj.loads, _closed_loads())
    # One more short request: 3/6 = 0.5 for the fresh request on replica 1 (a=0);
    # the request on replica 0 (a=10) outlived the 5s: p = 0 for it.
    warm_start(surv, [1], [5])
    proj = _brh(surv).projected(_cluster())
    assert proj.ok
    expect = _closed_loads()
    expect[1, 5:] = 0.0
    np.testing.assert_array_equal(proj.loads, expect)


def _pool() -> PromptPool:
    pool = PromptPool(16)
    for j, s in enumerate([30, 45, 70, 5]):
        pool.add(PoolRequest(f"p{j}", s))
    return pool


def test_raising_predictor_degrades_to_closed_gate_not_a_crash() -> None:
    ref = _brh(Fixed(0.0, 0.0)).schedule(_cluster(), _pool(), 0.0, 0)
    res = _brh(Raises(0.0, 0.0)).schedule(_cluster(), _pool(), 0.0, 0)
    assert not res.predictor_ok
    assert ref.predictor_ok
    assert res.assignments == ref.assignments
    assert len(res.assignments) == 2  # the two free slots are used


def test_timed_out_predictor_degrades_to_closed_gate() -> None:
    now = [0.0]
    slow = Slow(now)
    res = _brh(slow, clock=lambda: now[0]).schedule(_cluster(), _pool(), 0.0, 0)
    ref = _brh(Fixed(0.0, 0.0)).schedule(_cluster(), _pool(), 0.0, 0)
    assert not res.predictor_ok
    assert res.assignments == ref.assignments
    proj = _brh(slow, clock=lambda: now[0]).projected(_cluster())
    loads, ok = proj.loads, proj.ok
    assert not ok
    np.testing.assert_array_equal(loads, _closed_loads())


def test_oracle_outside_the_simulator_degrades_to_closed_gate() -> None:
    res = _brh(make_predictor("oracle", horizon=H)).schedule(_cluster(), _pool(), 0.0, 0)
    assert not res.predictor_ok
