"""The stated fairness rule on the run's own release clock (``pace_rule_excess``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from br_serve.sim.metrics import pace_rule_excess


@dataclass
class _Steps:
    """The step columns a run record has; only ``tau_s`` is read here."""

    tau_s: np.ndarray
    max_load_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))
    imbalance_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))
    running: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sample_loads: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class _Run:
    """Four steps of 1 s each, starting at t = 0, 1, 2, 3."""

    admit_step: np.ndarray
    enqueue_order: np.ndarray | None
    enqueue_s: np.ndarray
    steps: _Steps

    def step_end_s(self) -> np.ndarray:
        return np.cumsum(self.steps.tau_s)


def _run(admit: list[int], order: list[int], enq: list[float]) -> _Run:
    return _Run(np.asarray(admit), np.asarray(order), np.asarray(enq, dtype=np.float64),
                _Steps(np.ones(4)))


def test_fcfs_order_has_no_excess_beyond_its_own_wait() -> None:
    # admitted in FCFS order at t = 0, 1, 2: each waits exactly its FCFS wait, so the
    # excess is wait - 2 x wait = -wait
    got = pace_rule_excess(_run([0, 1, 2], [0, 1, 2], [0.0, 0.0, 0.0]), factor=2.0)
    assert got.tolist() == pytest.approx([0.0, -1.0, -2.0])


def test_an_overtaken_request_pays_its_delay_beyond_factor_times_its_turn() -> None:
    # r0 entered first but was admitted last (t = 3); the run's admissions went out at
    # t = 0, 1, 3, so r0's FCFS turn was the first one (t = 0): FCFS wait 0, pool wait 3.
    # r1 (rank 1) got the first slot (t = 0) and r2 (rank 2) the second (t = 1): both
    # ahead of their turns (t = 1 and t = 3)
    got = pace_rule_excess(_run([3, 0, 1], [0, 1, 2], [0.0, 0.0, 0.0]), factor=2.0)
    assert got.tolist() == pytest.approx([3.0, 0.0 - 2.0 * 1.0, 1.0 - 2.0 * 3.0])
    # with a later entry the FCFS wait counts from it: r2 entered at 0.5
    got = pace_rule_excess(_run([3, 0, 1], [0, 1, 2], [0.0, 0.0, 0.5]), factor=1.0)
    assert got[2] == pytest.approx((1.0 - 0.5) - (3.0 - 0.5))


def test_a_request_never_admitted_has_no_excess() -> None:
    got = pace_rule_excess(_run([0, -1], [0, 1], [0.0, 0.0]))
    assert got[0] == pytest.approx(0.0) and np.isnan(got[1])
    assert np.isnan(pace_rule_excess(
        _Run(np.asarray([0]), None, np.asarray([0.0]), _Steps(np.ones(1))))).all()
