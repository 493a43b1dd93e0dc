"""StepStats: busy-step accounting as the simulator defines it."""

from __future__ import annotations

import numpy as np
import pytest

from br_serve.serve.scheduler.stepstats import StepStats


def test_busy_steps_only_and_imbalance() -> None:
    st = StepStats()
    assert st.record_step(np.array([10, 4, 0]), 3, 0.2, 0.1) == 3 * 10 - 14
    st.record_step(np.array([0, 0, 0]), 0, 0.5, 0.03)  # idle: not counted
    st.record_step(np.array([6, 6, 6]), 3, 0.1, 0.05)
    d = st.as_dict()
    assert d["steps"] == 2 and d["tokens"] == 6
    assert d["mean_imbalance_tokens"] == pytest.approx(16 / 2)
    assert d["throughput_tok_s"] == pytest.approx(6 / 0.3)
    assert d["model_throughput_tok_s"] == pytest.approx(6 / 0.15)
    assert st.recent_mean_imbalance() == pytest.approx(16 / 3)  # recent includes idle


def test_ticks_and_reset() -> None:
    st = StepStats()
    for t in (0.001, 0.002, 0.003):
        st.record_tick(t, 2)
    d = st.as_dict()
    assert d["ticks"] == 3 and d["assigned"] == 6
    assert d["tick_dispatch_ms_p50"] == pytest.approx(2.0)
    assert d["tick_dispatch_s_total"] == pytest.approx(0.006)
    st.reset()
    assert st.as_dict()["ticks"] == 0 and st.recent_mean_imbalance() == 0.0
