"""The scheduler's online step calibration, fed fake rank-0 reports (no Ray).

With delta reports only the group's rank 0 reports every step; its report carries every
member's ``(load, running, compute time)`` of the step (the barrier rows). Here the
truth is known: each replica's compute time is ``a_g L + c_g N + b_g`` with 1% noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from br_serve.core import ClusterSnapshot, PromptPool, TickResult, build_policy
from br_serve.core.calibration import StepCalibrator
from br_serve.core.step import StepModel
from br_serve.engine.base import SamplingParams
from br_serve.serve.scheduler.core import SchedulerCore
from br_serve.serve.wire.messages import Admission, ReplicaReport
from br_serve.transport.base import KVHandle

G = 4
# a s/token, b s, c s/request per replica: replicas 2 and 3 are 1.5x slower
A = np.array([6e-7, 6e-7, 9e-7, 9e-7])
B = np.array([0.025, 0.025, 0.0375, 0.0375])
C = np.array([1e-3, 1e-3, 1.5e-3, 1.5e-3])
#: what the graph is configured with (the prior): homogeneous, no batch term
CONFIGURED = StepModel(5e-7, 0.03, 0.0)


class Spy:
    """A policy that records the snapshots it is given (and runs ``inner``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[ClusterSnapshot] = []

    def schedule(self, snap: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        self.seen.append(snap)
        out: TickResult = self.inner.schedule(snap, pool, now_s, tick)
        return out


def _core(policy: Any, calibrate: bool = True, slots: int = 16) -> SchedulerCore:
    core = SchedulerCore(G, slots, 64, CONFIGURED, policy, detail=False,
                         clock=iter(range(10**6)).__next__,
                         calibrator=StepCalibrator(G, CONFIGURED) if calibrate else None)
    for g in range(G):
        core.mark_alive(g, f"i{g}")
    core.members.begin(tuple(range(G)))
    return core


def _rank0(core: SchedulerCore, step: int, loads: Any, running: Any,
           compute_s: Any) -> ReplicaReport:
    """Rank 0's delta report of barrier step ``step`` (nothing changed on it)."""
    return ReplicaReport(
        replica=0, generation=core.members.generation, step=step, load_tokens=0,
        running_ids=(), prompt_tokens=(), decoded_tokens=(), finished_ids=(),
        finished_output_tokens=(), members=tuple(range(G)),
        barrier_loads=tuple(int(x) for x in loads),
        barrier_running=tuple(int(x) for x in running),
        barrier_flags=(0,) * G, barrier_compute_s=tuple(float(x) for x in compute_s),
        compute_s=float(compute_s[0]), barrier_s=0.0, incarnation="i0",
        barrier_step=step, full=False)


def _feed(core: SchedulerCore, rng: np.random.Generator, steps: int, start: int = 1,
          slow: dict[int, float] | None = None) -> None:
    """``steps`` measured steps; ``slow``: replica -> factor on its true time."""
    factor = np.ones(G)
    for g, f in (slow or {}).items():
        factor[g] = f
    for k in range(start, start + steps):
        load = rng.uniform(2e4, 1.5e5, G).round()
        run = rng.integers(4, 17, G)
        t = (A * load + C * run + B) * factor * (1 + 0.01 * rng.standard_normal(G))
        core.on_report(_rank0(core, k, load, run, t))


def _rel_err(core: SchedulerCore, factor: np.ndarray | None = None) -> np.ndarray:
    coef = core.coefficients()
    assert coef is not None
    f = np.ones(G) if factor is None else factor
    got = np.stack([coef.a_s_per_token, coef.b_s, coef.c_s_per_request])
    out: np.ndarray = np.abs(got / (np.stack([A, B, C]) * f) - 1)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_rank0_reports_fit_every_replica_within_5_percent_after_200_steps(seed: int) -> None:
    core = _core(build_policy("br0", {"cost": "time"}))
    _feed(core, np.random.default_rng(seed), 200)
    errs = _rel_err(core)
    assert errs.max() < 0.05, errs
    coef = core.coefficients()
    assert coef is not None and coef.calibrated.all() and coef.steps.tolist() == [200] * G


def test_a_mid_run_2x_slowdown_of_one_replica_is_followed() -> None:
    core = _core(build_policy("br0", {"cost": "time"}))
    rng = np.random.default_rng(7)
    _feed(core, rng, 300)
    assert _rel_err(core).max() < 0.05
    _feed(core, rng, 200, start=301, slow={1: 2.0})
    two = np.array([1.0, 2.0, 1.0, 1.0])
    errs = _rel_err(core, two)
    assert errs[:, 1].max() < 0.05, errs  # back within 5% of the new truth in 200 steps
    assert np.delete(errs, 1, axis=1).max() < 0.05, errs  # the others never moved


def test_idle_members_and_dead_replicas_are_not_fitted() -> None:
    core = _core(build_policy("br0", {"cost": "time"}))
    rng = np.random.default_rng(3)
    for k in range(1, 51):
        load = rng.uniform(2e4, 1.5e5, G).round()
        run = rng.integers(4, 17, G)
        load[3], run[3] = 0, 0  # replica 3 runs nothing: its (tiny) time is no evidence
        t = A * load + C * run + B
        t[3] = 1e-5
        core.on_report(_rank0(core, k, load, run, t))
    coef = core.coefficients()
    assert coef is not None
    assert coef.steps.tolist() == [50, 50, 50, 0]
    assert coef.b_s[3] == pytest.approx(CONFIGURED.b_s)  # still the prior
    core.mark_dead(2)
    core.on_report(_rank0(core, 51, [1e4] * G, [4, 4, 4, 0], [0.03] * G))
    coef = core.coefficients()
    assert coef is not None and coef.steps.tolist() == [51, 51, 50, 0]


def test_the_policy_sees_the_fit_and_routes_on_it() -> None:
    """Of two live replicas, replica 1 holds fewer tokens but is measured 2x slower, so
    it sets the step: token BR-0 sends the next request there (it fills the token
    margin), time-aware BR-0 (with the fit in its snapshot) to replica 0."""
    picks = {}
    for cost in ("tokens", "time"):
        spy = Spy(build_policy("br0", {"cost": cost}))
        core = _core(spy, calibrate=cost == "time")
        slow = np.array([1.0, 2.0, 1.0, 1.0])
        rng = np.random.default_rng(5)
        for k in range(1, 201):
            load = rng.uniform(2e4, 1.5e5, G).round()
            run = rng.integers(4, 17, G)
            core.on_report(_rank0(core, k, load, run, (A * load + C * run + B) * slow))
        core.mark_dead(2)
        core.mark_dead(3)
        for g, prompt in ((0, 10_000), (1, 9_000)):  # the mirror's rows now
            core.on_report(ReplicaReport(
                replica=g, generation=core.members.generation, step=201, load_tokens=0,
                running_ids=(f"r{g}",), prompt_tokens=(prompt,), decoded_tokens=(0,),
                finished_ids=(), finished_output_tokens=(), members=tuple(range(G)),
                barrier_loads=(), barrier_running=(), compute_s=0.0, barrier_s=0.0,
                incarnation=f"i{g}", barrier_step=200, full=True))
        assert core.submit(Admission("new", "o", 200, 0, SamplingParams(max_tokens=4),
                                     KVHandle("fake", "new", 200))) == "queued"
        (d,) = core.tick()
        picks[cost] = d.replica
        snap = spy.seen[-1]
        assert snap.load_tokens.tolist()[:2] == [10_000, 9_000]
        if cost == "time":
            assert snap.step_a_s_per_token[1] == pytest.approx(2 * A[1], rel=0.05)
            assert snap.step_b_s[0] == pytest.approx(B[0], rel=0.05)
        else:
            assert snap.step_a_s_per_token.tolist() == [CONFIGURED.a_s_per_token] * G
    assert picks == {"tokens": 1, "time": 0}


def test_state_exports_the_fit_or_the_configured_model() -> None:
    core = _core(build_policy("br0", {"cost": "time"}))
    _feed(core, np.random.default_rng(1), 200)
    s = core.state()
    assert s["step_coefficients"] == "calibrated"
    for g, rep in enumerate(s["replicas"]):
        st = rep["step"]
        assert st["a_s_per_token"] == pytest.approx(A[g], rel=0.05)
        assert st["b_s"] == pytest.approx(B[g], rel=0.05)
        assert st["c_s_per_request"] == pytest.approx(C[g], rel=0.05)
        assert st["steps"] == 200 and st["calibrated"] is True
        # 1% noise on a ~0.05-0.15 s step: the robust scale is of that order
        assert 1e-4 < st["residual_scale_s"] < 3e-3
    plain = _core(build_policy("br0"), calibrate=False)
    _feed(plain, np.random.default_rng(1), 5)
    s = plain.state()
    assert s["step_coefficients"] == "configured" and plain.coefficients() is None
    assert s["replicas"][2]["step"] == {"a_s_per_token": CONFIGURED.a_s_per_token,
                                        "b_s": CONFIGURED.b_s, "c_s_per_request": 0.0}


def test_a_calibrator_for_another_cluster_size_is_refused() -> None:
    with pytest.raises(ValueError, match="calibrator"):
        SchedulerCore(G, 4, 8, CONFIGURED, build_policy("jsq"), detail=False,
                      calibrator=StepCalibrator(G + 1, CONFIGURED))



def test_steps_are_priced_with_the_engines_model_when_it_differs() -> None:
    """The step counters' model-priced time uses ``price_model`` (the emulated engines'
    own model), not the configured one the policy is told."""
    true = StepModel(tuple(A.tolist()), tuple(B.tolist()), tuple(C.tolist()))
    core = SchedulerCore(G, 16, 64, CONFIGURED, build_policy("br0"), detail=False,
                         clock=iter(range(10**6)).__next__, price_model=true)
    for g in range(G):
        core.mark_alive(g, f"i{g}")
    core.members.begin(tuple(range(G)))
    load, run = np.array([1e4, 2e4, 3e4, 4e4]), np.array([1, 2, 3, 4])
    core.on_report(_rank0(core, 1, load, run, A * load + C * run + B))
    assert core.stats.model_step_s_sum == pytest.approx(float((A * load + C * run + B).max()))
