"""The simulator feeds predictors: every finished request observed once, oracle exact."""

from __future__ import annotations

import numpy as np

from br_serve.core import FinishedRequests, Prediction, RunningRequests
from br_serve.sim import parse_sim_config, simulate
from br_serve.traces import SyntheticSpec, synthetic_trace


class Spy:
    """Records what the simulator shows it; answers like the oracle.

    BR-H catches any exception of ``predict`` (a failing predictor closes the gate for
    the tick), so a check inside ``predict`` is recorded in ``errors`` and the test
    asserts that list empty, rather than relying on the raise."""

    name = "spy"

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.checked = 0
        self.errors: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.errors.append(what)

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        self.check(running.true_remaining_steps is None,  # only an oracle gets the truth
                   "a non-oracle predictor was shown the true remaining steps")
        n = len(running)
        self.checked += n
        return Prediction(p_fin=np.zeros(n), mu_rem=np.full(n, float(horizon_steps)))

    def observe(self, finished: FinishedRequests) -> None:
        self.seen.extend(finished.output_tokens.tolist())


class OracleSpy(Spy):
    name = "oracle-spy"
    reads_true_remaining = True  # the capability that makes the simulator attach them

    def __init__(self, outputs: dict[int, int]) -> None:
        super().__init__()
        self.outputs = outputs

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        rem = running.true_remaining_steps
        if rem is None:
            self.errors.append("the oracle was not shown the true remaining steps")
            raise ValueError("no true remaining steps")
        for rid, dec, r in zip(running.request_ids, running.decoded_tokens, rem, strict=True):
            self.check(r == self.outputs[int(rid[1:])] - dec,  # true remaining steps
                       f"{rid}: true remaining {r}, expected {self.outputs[int(rid[1:])] - dec}")
        self.checked += len(running)
        fin = rem <= horizon_steps
        return Prediction(p_fin=fin.astype(float), mu_rem=rem.astype(float))


def test_observe_each_finish_once() -> None:
    trace = synthetic_trace(SyntheticSpec(requests=200, rate_per_s=30, seed=2))
    spy = Spy()
    res = simulate(trace, parse_sim_config(policy="brh", replicas=3, slots=4), predictor=spy)
    assert sorted(spy.seen) == sorted(trace.output_tokens.tolist())
    assert spy.checked > 0
    assert spy.errors == []
    assert res.summary()["predictor_failed_ticks"] == 0


def test_oracle_sees_true_remaining() -> None:
    trace = synthetic_trace(SyntheticSpec(requests=150, rate_per_s=30, seed=4))
    spy = OracleSpy(dict(enumerate(trace.output_tokens.tolist())))
    res = simulate(trace, parse_sim_config(policy="brh", replicas=3, slots=4), predictor=spy)
    assert spy.checked > 0
    assert spy.errors[:3] == []
    assert res.summary()["predictor_failed_ticks"] == 0
