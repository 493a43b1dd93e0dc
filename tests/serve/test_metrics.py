"""The scheduler's gauges of the fitted step coefficients, against a fake
``ray.util.metrics`` (no cluster; ``tests/serve/test_graph_ray.py`` scrapes the real
Prometheus endpoint)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

from br_serve.core.calibration import Coefficients, StepCalibrator
from br_serve.core.step import StepModel
from br_serve.serve.config import parse_graph_config
from tests.serve.test_sched_calibration import G, _feed


class FakeMetric:
    """Records ``set``/``observe`` calls by tags."""

    made: ClassVar[dict[str, FakeMetric]] = {}

    def __init__(self, name: str, description: str = "", tag_keys: Any = (),
                 boundaries: Any = None) -> None:
        self.name, self.tag_keys = name, tuple(tag_keys)
        self.values: dict[tuple[tuple[str, str], ...], float] = {}
        FakeMetric.made[name] = self

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        assert set(tags or {}) == set(self.tag_keys), (self.name, tags)
        self.values[tuple(sorted((tags or {}).items()))] = value

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.set(value, tags)


@pytest.fixture()
def fake_metrics(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeMetric]:
    from ray.util import metrics

    FakeMetric.made = {}
    monkeypatch.setattr(metrics, "Gauge", FakeMetric)
    monkeypatch.setattr(metrics, "Histogram", FakeMetric)
    return FakeMetric.made


def _by_replica(m: FakeMetric) -> list[float]:
    return [m.values[(("replica", str(g)),)] for g in range(len(m.values))]


def test_step_coefficient_gauges_per_replica(fake_metrics: dict[str, FakeMetric]) -> None:
    from br_serve.serve.metrics import SchedulerMetrics

    m = SchedulerMetrics()
    coef = Coefficients(a_s_per_token=np.array([5e-7, 7.5e-7]), b_s=np.array([0.03, 0.045]),
                        c_s_per_request=np.array([1e-3, 0.0]), steps=np.array([300, 300]),
                        calibrated=np.array([True, True]))
    m.step_coefficients(coef, np.array([2e-4, 3e-4]))
    assert _by_replica(fake_metrics["br_step_coef_a_s_per_token"]) == [5e-7, 7.5e-7]
    assert _by_replica(fake_metrics["br_step_coef_b_s"]) == [0.03, 0.045]
    assert _by_replica(fake_metrics["br_step_coef_c_s_per_request"]) == [1e-3, 0.0]
    assert _by_replica(fake_metrics["br_step_residual_scale_s"]) == [2e-4, 3e-4]


def test_scheduler_exports_the_fit_throttled(fake_metrics: dict[str, FakeMetric],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor shell puts its core's fit into the gauges at most once a second (no
    Ray: the actor's constructor builds the core and touches no cluster)."""
    from br_serve.serve.metrics import SchedulerMetrics
    from br_serve.serve.scheduler import actor as sched_mod

    sched = sched_mod.Scheduler(parse_graph_config(replicas=G, policy_options={"cost": "time"}),
                                [f"d{g}" for g in range(G)])
    assert sched.core.calibrator is not None
    assert sched.core.calibrator.g == G
    sched._metrics = SchedulerMetrics()
    now = [100.0]
    monkeypatch.setattr(sched_mod, "time", SimpleNamespace(monotonic=lambda: now[0]))
    for g in range(G):
        sched.core.mark_alive(g, f"i{g}")
    sched.core.members.begin(tuple(range(G)))
    _feed(sched.core, np.random.default_rng(0), 200)
    sched._export_coefficients()
    a = fake_metrics["br_step_coef_a_s_per_token"]
    coef = sched.core.coefficients()
    assert coef is not None
    assert _by_replica(a) == coef.a_s_per_token.tolist()
    _feed(sched.core, np.random.default_rng(1), 50, start=201, slow={0: 2.0})
    now[0] += 0.5
    sched._export_coefficients()  # too soon: unchanged
    assert _by_replica(a)[0] == coef.a_s_per_token[0]
    now[0] += 0.6
    sched._export_coefficients()
    assert _by_replica(a)[0] > 1.5 * coef.a_s_per_token[0]


def test_no_calibration_no_coefficient_gauges_set(fake_metrics: dict[str, FakeMetric]
                                                  ) -> None:
    from br_serve.serve.metrics import SchedulerMetrics
    from br_serve.serve.scheduler import actor as sched_mod

    sched = sched_mod.Scheduler(parse_graph_config(replicas=G), [f"d{g}" for g in range(G)])
    assert sched.core.calibrator is None
    sched._metrics = SchedulerMetrics()
    sched._export_coefficients()
    assert fake_metrics["br_step_coef_a_s_per_token"].values == {}


def test_the_configured_model_is_the_prior() -> None:
    cal = StepCalibrator(2, StepModel((5e-7, 1e-6), (0.03, 0.06), (0.0, 2e-3)))
    c = cal.coefficients()
    assert c.a_s_per_token.tolist() == pytest.approx([5e-7, 1e-6])
    assert c.b_s.tolist() == pytest.approx([0.03, 0.06])
    assert c.c_s_per_request.tolist() == pytest.approx([0.0, 2e-3])


def test_request_timeline_first_mark_wins_keeps_the_latest_and_snapshot_is_a_copy() -> None:
    from br_serve.serve.metrics import RequestTimeline

    tl = RequestTimeline(limit=2)
    tl.mark("a", "pool_in", seed=7)
    tl.mark("a", "pool_in", at_s=1.0, seed=8)  # a second mark of a name is ignored
    tl.mark("a", "arrival", at_s=5.0)
    tl.mark("b", "bound", replica=3)
    a = tl.snapshot()["marks"]["a"]
    assert a["seed"] == 7 and a["arrival"] == 5.0 and a["pool_in"] > 1e9
    tl.mark("c", "bound")  # over the limit: the oldest request ("a") makes room
    tl.mark("b", "installed")  # a kept request still takes marks
    snap = tl.snapshot()
    assert list(snap["marks"]) == ["b", "c"] and snap["dropped"] == 1
    assert snap["marks"]["b"]["replica"] == 3 and "installed" in snap["marks"]["b"]
    snap["marks"]["b"]["x"] = 1.0
    assert "x" not in tl.snapshot()["marks"]["b"]
