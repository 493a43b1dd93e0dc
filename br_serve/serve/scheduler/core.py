"""The scheduler's logic, composed of managers, without Ray or asyncio.

:class:`SchedulerCore` owns

- the **prompt pool** (:class:`PromptPool`: what the policy needs of a waiting request:
  id, prompt length, prefix key, when it entered) and the **admission table** (the
  one place that holds a request's :class:`Admission`, i.e. its KV handle and sampling
  parameters, from ``submit`` until a replica took it or it was given up);
- the **mirror** of the decode replicas with its in-flight bookkeeping (:class:`Mirror`);
- the barrier **membership** (:class:`Membership`);
- the **policy** (built by the caller) and the predictor it learns from (feedback of
  every finished request);
- the step counters (:class:`StepStats`);
- when the policy needs calibrated step costs, the **step calibrator**
  (:class:`StepCalibrator`): rank 0's per-step report carries every member's
  ``(load, running, measured compute time)`` of the step, which it fits per replica;
  the policy then sees the fitted coefficients in its snapshot (as in the simulator).
  Without it nothing of this runs.

The scheduler actor (:mod:`br_serve.serve.scheduler.actor`) feeds it RPCs and replica
answers and carries out the :class:`Dispatch` list each :meth:`SchedulerCore.tick`
returns. State changes happen here only; every method is synchronous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from br_serve.core import FinishedRequests, PolicyBase, PoolFullError, PoolRequest, PromptPool
from br_serve.core.calibration import Coefficients, StepCalibrator, with_coefficients
from br_serve.core.predictor import TerminationPredictor
from br_serve.core.step import StepModel
from br_serve.serve.scheduler.membership import Membership
from br_serve.serve.scheduler.mirror import Mirror
from br_serve.serve.scheduler.stepstats import StepStats
from br_serve.serve.wire.messages import Admission, AdmitReply, ReplicaReport

#: ``submit``'s answer: ``queued``; ``duplicate`` (already queued or running:
#: idempotent resubmission); ``full`` (pool at capacity: backpressure); ``no_replica``.
SubmitStatus = Literal["queued", "duplicate", "full", "no_replica"]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send ``admission`` to decode replica ``replica`` (``DecodeReplica.admit``);
    its answer goes to :meth:`SchedulerCore.answered` with ``seq``."""

    replica: int
    admission: Admission
    seq: int


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """``tick_due``: every member has reported this step. ``imbalance_tokens``: the
    step's imbalance when this was the group's rank-0 report, else None."""

    tick_due: bool
    imbalance_tokens: int | None = None


class SchedulerCore:
    """See the module docstring. ``step_model``: the configured step model (the policy's
    view, and what the step counters price each measured step with); ``clock`` gives
    seconds (enqueue stamps, ``now_s``). ``kv_limit_tokens``: KV tokens per replica
    (None: unbounded). ``calibrator``: fit every replica's step coefficients from the
    measured steps and give the policy the fit instead of ``step_model`` (a
    :class:`StepCalibrator` whose prior is ``step_model``).
    ``price_model``: what the step counters price measured steps with, when the engines
    run another model than the configured one (emulated heterogeneity); default
    ``step_model``. ``engine_slots``: requests each engine runs at once when ``slots``
    also counts the places of its queue (``pool.dispatch_ahead``); see :class:`Mirror`."""

    def __init__(self, replicas: int, slots: int, pool_capacity: int,
                 step_model: StepModel, policy: PolicyBase[Any], detail: bool,
                 predictor: TerminationPredictor | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 calibrator: StepCalibrator | None = None,
                 price_model: StepModel | None = None,
                 kv_limit_tokens: int | None = None,
                 engine_slots: int | None = None) -> None:
        self.g = replicas
        self.pool = PromptPool(pool_capacity)
        self.admissions: dict[str, Admission] = {}
        self.mirror = Mirror(replicas, slots, step_model, kv_limit_tokens, engine_slots)
        for g in range(replicas):  # alive once a ping says so
            self.mirror.state.set_alive(g, False)
        self.members = Membership(replicas)
        self.policy = policy
        self.detail = detail
        self.predictor = predictor
        self.stats = StepStats()
        if calibrator is not None and calibrator.g != replicas:
            raise ValueError(f"calibrator: fits {calibrator.g} replicas, not {replicas}")
        self.calibrator = calibrator
        self._price = (step_model if price_model is None else price_model).arrays(replicas)
        self._coef: Coefficients | None = None  # the fit, until the next measured step
        self.ticks = 0
        #: when the last tick asked to be run again (``TickResult.retick_s``, the
        #: policy's clock: :meth:`now_s`), even if nothing else changes; None: no ask
        self.retick_s: float | None = None
        self._clock = clock
        self._t0 = clock()

    def now_s(self) -> float:
        return self._clock() - self._t0

    # -- requests -------------------------------------------------------------------
    def submit(self, entry: Admission) -> SubmitStatus:
        rid = entry.request_id
        if rid in self.admissions or rid in self.mirror:
            return "duplicate"
        if not self.mirror.alive().any():
            return "no_replica"
        req = PoolRequest(rid, entry.prompt_tokens, enqueued_s=self.now_s(),
                          enqueued_tick=self.ticks, arrival_s=entry.arrival_s,
                          prefix_hash=entry.prefix_hash)
        try:
            self.pool.add(req)
        except PoolFullError:
            return "full"
        self.admissions[rid] = entry
        return "queued"

    def cancel(self, request_id: str) -> None:
        """The owner gave ``request_id`` up: out of the pool, and never put back."""
        self.admissions.pop(request_id, None)
        if request_id in self.pool:
            self.pool.remove(request_id)

    def locate(self, request_id: str) -> tuple[str, int]:
        """``("pool" | "running" | "unknown", replica)`` (-1 when none)."""
        if request_id in self.pool:
            return "pool", -1
        g = self.mirror.replica_of(request_id)
        return ("running", g) if g >= 0 else ("unknown", -1)

    # -- the tick -------------------------------------------------------------------
    def tick(self) -> list[Dispatch]:
        """Run the policy once on the pool; the assignments leave the pool for the
        mirror (in flight) and come back as the admissions to send."""
        self.retick_s = None
        if not len(self.pool) or not self.mirror.state.free_slots().any():
            return []
        t0 = time.perf_counter()
        snap = self.mirror.snapshot(self.detail)
        coef = self.coefficients()
        if coef is not None:
            snap = with_coefficients(snap, coef)
        res = self.policy.schedule(snap, self.pool, self.now_s(), self.ticks)
        self.ticks += 1
        self.retick_s = res.retick_s  # a held request: the driver ticks again by then
        tickets = [self.pool.ticket(a.request_id) for a in res.assignments]
        reqs = self.pool.remove_many(res.assignments)
        out: list[Dispatch] = []
        for a, req, ticket in zip(res.assignments, reqs, tickets, strict=True):
            seq = self.mirror.dispatch(a, req, ticket)
            out.append(Dispatch(a.replica, self.admissions[a.request_id], seq))
        self.stats.record_tick(time.perf_counter() - t0, len(out))
        return out

    def answered(self, d: Dispatch, reply: AdmitReply | None) -> bool:
        """Replica ``d.replica``'s answer to ``d`` (None: the call failed). True when the
        request went back to the pool (a tick may place it elsewhere)."""
        rid = d.admission.request_id
        entry = self.mirror.answered(d.replica, rid, d.seq, reply)
        if reply is not None and (reply.taken or reply.status == "failed"):
            later = self.mirror.dispatch_of(rid)
            if rid not in self.pool and (later is None or later == d.seq):
                # the replica (or the re-prefill) owns it now; a late answer of a
                # superseded dispatch (its replica died, the request went back to the
                # pool or elsewhere) must not drop the admission of the newer one
                self.admissions.pop(rid, None)
            return False
        if entry is None or rid not in self.admissions:
            return False  # cancelled meanwhile, or already handled
        self.stats.dispatch_failures += 1
        self.pool.restore(entry.request, entry.ticket)
        return True

    # -- replicas -------------------------------------------------------------------
    def on_report(self, rep: ReplicaReport) -> ReportOutcome:
        """Apply one replica's post-step report (ignored for a dead replica)."""
        if not self.mirror.alive()[rep.replica]:
            return ReportOutcome(False)
        if rep.barrier_loads and rep.generation == self.members.generation:
            self.mirror.advance(rep.members, rep.generation, rep.barrier_step)
        finished = self.mirror.apply_report(rep)
        if finished and self.predictor is not None:
            n = len(finished)
            self.predictor.observe(FinishedRequests(
                prompt_tokens=np.asarray([f.prompt_tokens for f in finished], dtype=np.int64),
                output_tokens=np.asarray([f.output_tokens for f in finished], dtype=np.int64),
                prefix_hash=np.asarray([f.prefix_hash for f in finished], dtype=np.int64),
                finish_s=np.full(n, self.now_s())))
        imb = None
        if (rep.barrier_loads and rep.members and rep.replica == rep.members[0]
                and rep.generation == self.members.generation):
            loads = np.asarray(rep.barrier_loads, dtype=np.int64)
            running = np.asarray(rep.barrier_running, dtype=np.int64)
            members = np.asarray(rep.members, dtype=np.int64)
            pa, pb, pc = self._price
            model_s = float((pa[members] * loads + pc[members] * running
                             + pb[members]).max())
            imb = self.stats.record_step(loads, int(sum(rep.barrier_running)),
                                         rep.compute_s + rep.barrier_s, model_s)
            if self.calibrator is not None and len(rep.barrier_compute_s) == len(members):
                self._calibrate(members, loads, running, rep.barrier_compute_s)
        return ReportOutcome(self.members.step_complete(rep), imb)

    def _calibrate(self, members: npt.NDArray[np.int64], loads: npt.NDArray[np.int64],
                   running: npt.NDArray[np.int64], compute_s: tuple[float, ...]) -> None:
        """One step of every member into the calibrator. A member that ran nothing is
        left out (an engine may skip the forward pass then, and the fit prices the steps
        that run requests: what admitting one costs), and so is one marked dead."""
        assert self.calibrator is not None
        g = self.g
        load, cnt, t = np.zeros(g), np.zeros(g), np.full(g, np.nan)
        use = np.zeros(g, dtype=bool)
        load[members], cnt[members] = loads, running
        t[members] = compute_s
        use[members] = running > 0
        use &= self.mirror.alive()
        self.calibrator.update(load, cnt, t, mask=use)
        self._coef = None

    def coefficients(self) -> Coefficients | None:
        """The calibrator's current fit (None without a calibrator)."""
        if self.calibrator is None:
            return None
        if self._coef is None:
            self._coef = self.calibrator.coefficients()
        return self._coef

    def mark_dead(self, g: int) -> list[str]:
        """Replica ``g`` is gone: its unanswered dispatches go back to the pool. Returns
        the ids it had taken (their owners re-prefill them)."""
        back, lost = self.mirror.set_dead(g)
        for e in back:
            if e.request.request_id in self.admissions:
                self.pool.restore(e.request, e.ticket)
        for rid in lost:
            self.admissions.pop(rid, None)
        return lost

    def mark_alive(self, g: int, incarnation: str) -> None:
        self.mirror.set_alive(g, incarnation)

    def alive_replicas(self) -> list[int]:
        return [int(g) for g in np.flatnonzero(self.mirror.alive())]

    # -- views ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Per-replica load/running/free slots and step coefficients, pool, membership
        (``/v1/br/state``).

        ``step_coefficients`` says which coefficients the policy sees: ``calibrated``
        (each replica's ``step`` holds the online fit: ``a_s_per_token``, ``b_s``,
        ``c_s_per_request``, ``residual_scale_s``, the ``steps`` it has seen and whether
        it counts as ``calibrated``) or ``configured`` (the step model, as given)."""
        st = self.mirror.state
        loads, running, free = st.load_tokens(), st.running_requests(), st.free_slots()
        coef = self.coefficients()
        resid = None if self.calibrator is None else self.calibrator.residual_scale_s()

        def step(g: int) -> dict[str, Any]:
            if coef is None or resid is None:
                return {"a_s_per_token": float(st.step_a[g]), "b_s": float(st.step_b[g]),
                        "c_s_per_request": float(st.step_c[g])}
            return {"a_s_per_token": float(coef.a_s_per_token[g]),
                    "b_s": float(coef.b_s[g]), "c_s_per_request": float(coef.c_s_per_request[g]),
                    "residual_scale_s": float(resid[g]), "steps": int(coef.steps[g]),
                    "calibrated": bool(coef.calibrated[g])}

        return {
            "generation": self.members.generation, "members": list(self.members.members),
            "pool_size": len(self.pool), "pool_capacity": self.pool.capacity,
            "tick": self.ticks, "in_flight": self.mirror.inflight_count(),
            "recent_mean_imbalance_tokens": self.stats.recent_mean_imbalance(),
            "step_coefficients": "configured" if coef is None else "calibrated",
            "replicas": [{"replica": g, "alive": bool(st.alive[g]),
                          "load_tokens": int(loads[g]), "running": int(running[g]),
                          "free_slots": int(free[g]), "step": step(g)}
                         for g in range(self.g)],
        }
