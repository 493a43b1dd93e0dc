"""The scheduler actor: the singleton that runs the core policy on the prompt pool.

A thin shell: the logic is :class:`SchedulerCore` (pool, admission table, mirror,
membership, policy, feedback; tested without Ray), the Ray side is the
:class:`SchedulerIO` mixin (replica handles, pings, generations, dispatch). Ticks run
when new requests enter the pool, when a dispatch came back refused, and once per
decode step, after every member of the barrier group has reported that step.

Where state lives (why a crash loses nothing):
- The decode replicas own the running requests; the mirror is rebuilt from their
  per-step :class:`ReplicaReport`s plus assignments dispatched but not yet reported
  (in flight). A restarted scheduler rebuilds it from ``DecodeReplica.report``.
- Pool entries are owned by the ingress until a decode replica confirms admission
  (``Admitted``): the scheduler's pool is a cache. After a restart (``incarnation``
  changes) the ingress resubmits its unconfirmed entries; ``submit`` is idempotent.

Faults: a replica whose barrier failed, or that the ingress lost, is pinged; the dead
ones are marked dead (and killed) and a new barrier generation is formed among the
survivors. A late ping is a death only when Ray's GCS agrees, or once a replica alive
per the GCS stays silent for ``PING_MAX_S`` (:mod:`br_serve.serve.scheduler.io`). The
ingress replaces a dead replica with a new actor of the same name and tells the
scheduler (``replica_replaced``), which forms a generation that includes it.
Requests of a dead replica are re-prefilled (or errored) by the ingress that owns them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from br_serve.core import PolicyBase, PolicyContext, policy_class
from br_serve.core.calibration import StepCalibrator
from br_serve.core.predictor import TerminationPredictor
from br_serve.serve.config import GraphConfig
from br_serve.serve.scheduler.core import SchedulerCore, SubmitStatus
from br_serve.serve.scheduler.io import SchedulerIO
from br_serve.serve.wire.messages import Admission, ReplicaReport

#: a replacement's constructor may still run (imports, engine set-up); longer than
#: ``PING_MAX_S``, so also its hard bound (the GCS has a replica ALIVE only once built)
PING_S_REPLACED = 60.0
#: the fitted step coefficients go to the metrics at most this often (seconds)
COEF_EXPORT_S = 1.0


def build_policy(cfg: GraphConfig) -> tuple[PolicyBase[Any], TerminationPredictor | None,
                                           bool]:
    """The policy of ``cfg``, its predictor (if it needs one: built here, the one process
    that uses it) and whether it needs the per-request rows of the running requests."""
    cls = policy_class(cfg.policy.name)
    predictor = cfg.build_predictor()
    policy = cls(cfg.policy.parsed(), PolicyContext(
        rng=np.random.default_rng(cfg.seed), predictor=predictor))
    return policy, predictor, cls.needs_for(policy.options).running_detail


class Scheduler(SchedulerIO):
    """See the module docstring. Every RPC runs on the actor's event loop."""

    def __init__(self, cfg: GraphConfig, decode_names: list[str]) -> None:
        policy, predictor, detail = build_policy(cfg)
        model = cfg.router_step_model()
        # calibrated on the measured (scaled) step times; the configured model is its prior
        calib = (StepCalibrator(cfg.replicas, model)
                 if cfg.policy.needs().calibrated_step_costs else None)
        # the step counters price steps as the (emulated) engines run them
        # a rank's places: its slots plus the requests bound ahead (queued at the engine)
        core = SchedulerCore(cfg.replicas, cfg.places_per_replica(), cfg.pool.capacity,
                             model, policy, detail, predictor, calibrator=calib,
                             price_model=cfg.emulated_step_model(scaled=True),
                             kv_limit_tokens=cfg.kv_limit_tokens,
                             engine_slots=cfg.slots if cfg.dispatch_ahead() else None)
        self._io_init(cfg, decode_names, core)
        self._coef_exported = -float("inf")

    async def get_incarnation(self) -> str:
        await self._ensure_ready()
        return self.incarnation

    async def submit(self, entry: Admission) -> SubmitStatus:
        """Queue a prefilled request (see :data:`SubmitStatus`)."""
        await self._ensure_ready()
        status = self.core.submit(entry)
        if status == "queued":
            seed = entry.params.seed if entry.params.seed is not None else -1
            self._timeline.mark(entry.request_id, "pool_in", seed=seed)
            self._timeline.mark(entry.request_id, "arrival", at_s=entry.arrival_s)
            self._wake_tick()
        return status

    async def cancel(self, request_id: str) -> None:
        """The owner gave ``request_id`` up (its client went away)."""
        self.core.cancel(request_id)

    async def locate(self, request_id: str) -> tuple[str, int]:
        """``("pool" | "running" | "unknown", replica)`` for a request (-1 if none)."""
        await self._ensure_ready()
        return self.core.locate(request_id)

    async def report(self, rep: ReplicaReport) -> None:
        """A replica's report through Ray (before its report channel is open, or when
        that channel failed)."""
        self._start()
        self.reports_by_path["ray"] += 1
        self._on_report(rep)

    def _on_report(self, rep: ReplicaReport) -> None:
        out = self.core.on_report(rep)
        if self._metrics is not None:
            if out.imbalance_tokens is not None:
                self._metrics.imbalance.observe(out.imbalance_tokens)
                self._export_coefficients()
            self._metrics.replica(rep.replica, rep.load_tokens, len(rep.running_ids))
        if out.tick_due:
            self._wake_tick()

    def _export_coefficients(self) -> None:
        """The fitted step coefficients as gauges, at most every ``COEF_EXPORT_S``
        (Ray flushes metrics every few seconds; a fit every step would be wasted)."""
        now = time.monotonic()
        coef = self.core.coefficients()
        if coef is None or now - self._coef_exported < COEF_EXPORT_S:
            return
        self._coef_exported = now
        assert self.core.calibrator is not None
        self._metrics.step_coefficients(coef, self.core.calibrator.residual_scale_s())

    async def barrier_failed(self, replica: int, generation: int) -> None:
        """A replica's collective failed in ``generation``: find the dead, re-form."""
        await self._ensure_ready()
        self._spawn(self._reform(generation))

    async def replica_lost(self, replica: int) -> None:
        """The ingress lost contact with ``replica``: re-form if it was a member."""
        await self._ensure_ready()
        if replica in self.core.members.members:
            self._spawn(self._reform(self.core.members.generation))

    async def replica_replaced(self, replica: int) -> bool:
        """A new actor runs replica ``replica`` (same name): take it into the group.
        Returns whether it answered."""
        import ray

        await self._ensure_ready()
        try:
            self.decode[replica] = ray.get_actor(self.decode_names[replica],
                                                 namespace=self.cfg.serve.namespace)
        except ValueError:
            return False
        if await self._ping(replica, PING_S_REPLACED) is None:
            return False
        await self._reform()
        return bool(self.core.mirror.alive()[replica])

    async def ready(self) -> bool:
        """Would a request be served now: bootstrap done and a barrier group formed.
        Answers at once (False while starting)."""
        self._start()
        assert self._ready is not None
        if not self._ready.is_set() or self._failed is not None:
            return False
        return bool(self.core.members.members) and bool(self.core.mirror.alive().any())

    async def summary(self) -> dict[str, Any] | None:
        """What every ingress polls (at once; None while starting): the incarnation,
        alive replicas, and requests past prefill (pool + running + in flight)."""
        self._start()
        assert self._ready is not None
        if not self._ready.is_set():
            return None
        st = self.core.mirror.state
        return {"incarnation": self.incarnation, "alive": int(st.alive.sum()),
                "requests": len(self.core.pool) + int(st.running_requests().sum())}

    async def state(self) -> dict[str, Any]:
        """Per-replica load/running/free slots, pool size, recent imbalance, policy."""
        await self._ensure_ready()
        return {"policy": self.cfg.policy.name, "predictor": self.cfg.predictor.name,
                "incarnation": self.incarnation, "reports_by_path": dict(self.reports_by_path),
                **self.core.state()}

    async def timeline(self) -> dict[str, Any]:
        """Each request's pool entry and binding time (:class:`RequestTimeline`)."""
        return self._timeline.snapshot()

    async def stats(self) -> dict[str, Any]:
        """Counters since the last :meth:`reset_stats` (see :class:`StepStats`)."""
        await self._ensure_ready()
        return self.core.stats.as_dict()

    async def reset_stats(self) -> None:
        self.core.stats.reset()

