"""The scheduler actor's I/O: replica handles, pings, barrier generations, dispatch.

A mixin of :class:`br_serve.serve.scheduler.actor.Scheduler`; every decision is the pure
:class:`SchedulerCore`'s, every wait here is bounded:

- bootstrap looks each decode replica up by name for at most ``LOOKUP_S`` (a replica
  that died is never waited for: it is marked dead, and joins again when the ingress
  has replaced it), pings the found ones (their constructors may still run: at most
  ``START_S``), rebuilds the mirror from their latest reports, then adopts the running
  barrier generation or forms a new one. Readiness follows, even with no replica left
  (then requests are refused with 503); a failure of bootstrap itself is kept and
  raised to every caller instead of leaving them waiting;
- pings wait ``PING_S``, then ask the GCS's actor table (:mod:`br_serve.serve.wire.liveness`):
  a replica it has DEAD, or about which it cannot say, is dead (and killed, so that it
  cannot come back half-alive), as is one that Ray reports gone (at once). One it has
  ALIVE is slow, not dead (a loaded host stalls live processes for seconds): its ping
  is awaited up to ``PING_MAX_S``, then it is dead too (hung). One whose ``ping``
  raised is alive (a bug is logged, it is not a death);
- a late report is never a death; it is awaited like a ping all the same;
- forming a generation is bounded by the barrier's join timeout, and retried among the
  replicas still alive (a join or an admit that times out decides nothing: the pings
  that follow do);
- the decode replicas report over the scheduler's report channel
  (:mod:`br_serve.serve.wire.channel`, ``event_channel=tcp``): bootstrap opens it, and it is
  announced to every member of every generation (and of an adopted one), so a
  replacement or a replica that lost it gets it again; a replica without it reports
  through Ray (:meth:`Scheduler.report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from br_serve.serve.config import GraphConfig
from br_serve.serve.metrics import RequestTimeline
from br_serve.serve.scheduler.core import Dispatch, SchedulerCore
from br_serve.serve.wire.channel import ChannelServer, ChannelSpec, decode_reports
from br_serve.serve.wire.liveness import ActorState, gcs_state, reply
from br_serve.serve.wire.messages import AdmitReply, ReplicaReport
from br_serve.serve.wire.rpc import BUG, GONE, TIMEOUT, UNAVAILABLE

log = logging.getLogger(__name__)

LOOKUP_S = 10.0
START_S = 120.0
PING_S = 3.0
#: a replica alive per the GCS whose ping is late is awaited this long from the call
#: (or the caller's bound, if longer), then it is dead. Every rank of the lock-step group
#: stalls while a member is awaited, so it stays short; it covers the stalls seen on the
#: 2-core host (2-9 s, docs/vllm-cpu.md) twice over, and with the peers' barrier timeout
#: (``serve.barrier_timeout_s``, 10 s) a hung replica is killed within about 30 s,
#: before the ingress gives its poll up (``_POLL_MAX_S``, 60 s)
PING_MAX_S = 20.0
READY_S = 180.0
ADMIT_S = 120.0
_JOIN_S = 90.0


class SchedulerUnavailable(RuntimeError):
    """The scheduler is not ready (still starting, or its bootstrap failed)."""


class SchedulerIO:
    """See the module docstring. Set up by :meth:`_io_init`; runs on the actor's loop."""

    cfg: GraphConfig
    core: SchedulerCore

    def _io_init(self, cfg: GraphConfig, decode_names: list[str], core: SchedulerCore) -> None:
        self.cfg = cfg
        self.core = core
        self.decode_names = list(decode_names)
        self.decode: list[Any] = [None] * len(decode_names)
        self.incarnation = uuid.uuid4().hex
        self._wake: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self._group_lock: asyncio.Lock | None = None
        self._main: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._metrics: Any = None
        self._report_server: ChannelServer | None = None
        self._report_spec: ChannelSpec | None = None
        #: reports received by path: the report channel, a Ray ``report`` call, and the
        #: pulls of ``DecodeReplica.report`` when (re)starting (``/v1/br/state``)
        self.reports_by_path = {"channel": 0, "ray": 0, "pull": 0}
        self._timeline = RequestTimeline()  # pool entry and binding time per request
        #: whether a replica that is late to answer lives (tests: a fake GCS)
        self._actor_state: ActorState = gcs_state

    def _on_report(self, rep: ReplicaReport) -> None:
        raise NotImplementedError  # the Scheduler's

    # -- the report channel ----------------------------------------------------------
    async def _open_report_channel(self) -> None:
        host = self.cfg.channel_host()
        if host is None:
            return

        async def ready(g: int, _poll_no: int, _conn: object) -> bool:
            return 0 <= g < len(self.decode_names)

        def reports(g: int, _conn: object, reps: list[ReplicaReport]) -> None:
            for rep in reps:
                if rep.replica == g:  # a replica reports only for itself
                    self.reports_by_path["channel"] += 1
                    self._on_report(rep)

        server = ChannelServer(host, ready, reports, lambda g, conn: None,
                               decode=decode_reports)
        try:
            self._report_spec = await server.start()
            self._report_server = server
        except OSError as exc:
            log.warning("scheduler: no report channel on %s (%s)", host, exc)

    def _announce_reports(self, members: tuple[int, ...]) -> None:
        """Tell ``members`` where to report (a no-op on a replica that already does)."""
        if self._report_spec is None:
            return
        for g in members:
            if self.decode[g] is not None:
                self.decode[g].report_to.remote(self._report_spec)

    # -- lifecycle --------------------------------------------------------------------
    def _start(self) -> None:
        if self._main is not None:
            return
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._group_lock = asyncio.Lock()
        self._main = asyncio.get_running_loop().create_task(self._main_loop())
        try:
            from br_serve.serve.metrics import SchedulerMetrics

            self._metrics = SchedulerMetrics()
        except (ImportError, RuntimeError, ValueError) as exc:  # metrics are best-effort
            log.warning("scheduler: metrics disabled: %s", exc)

    async def _ensure_ready(self) -> None:
        """Wait (bounded) for bootstrap. Raises :class:`SchedulerUnavailable`."""
        self._start()
        assert self._ready is not None
        try:
            await asyncio.wait_for(self._ready.wait(), READY_S)
        except TIMEOUT as exc:
            raise SchedulerUnavailable(f"scheduler not ready after {READY_S:.0f} s") from exc
        if self._failed is not None:
            raise SchedulerUnavailable(f"scheduler bootstrap failed: {self._failed!r}")

    def _wake_tick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _arm_retick(self) -> None:
        """Tick again when the last tick asked (a bounded hold ends), even if no report
        or submission wakes the loop before."""
        if self.core.retick_s is not None:
            asyncio.get_running_loop().call_later(
                max(0.0, self.core.retick_s - self.core.now_s()), self._wake_tick)

    async def _main_loop(self) -> None:
        assert self._ready is not None and self._wake is not None
        try:
            await self._bootstrap()
        except Exception as exc:  # a bug: every caller gets it instead of a hang
            log.exception("scheduler: bootstrap failed")
            self._failed = exc
        self._ready.set()
        while self._failed is None:
            await self._wake.wait()
            self._wake.clear()
            t0 = time.perf_counter()
            try:
                dispatches = self.core.tick()
                self._send(dispatches)
                self._arm_retick()
            except Exception:  # a policy bug must not stop every later tick
                log.exception("scheduler: tick failed")
                dispatches = []
            if self._metrics is not None:
                self._metrics.pool.set(len(self.core.pool))
                if dispatches:
                    self._metrics.tick_ms.observe((time.perf_counter() - t0) * 1e3)

    async def _bootstrap(self) -> None:
        """Find the replicas, rebuild the mirror from them, adopt or form the group."""
        await self._open_report_channel()
        self.decode = await self._lookup(LOOKUP_S)
        found = [g for g, h in enumerate(self.decode) if h is not None]
        pings = await self._ping_all(found, START_S)  # waits for their constructors
        reports = dict(zip(pings, await asyncio.gather(
            *(self._report_of(g) for g in pings)), strict=True))
        for g in range(len(self.decode)):
            if g in pings:
                self.core.mark_alive(g, pings[g][1])
            else:
                self._mark_dead(g)
        for rep in reports.values():
            if rep is not None:
                self.core.on_report(rep)
        if not self.core.members.adopt({g: p[0] for g, p in pings.items()}, reports):
            self.core.members.at_least(max((p[0] for p in pings.values()), default=0))
            await self._form_group(tuple(sorted(pings)))
        else:
            self._announce_reports(self.core.members.members)
        log.info("scheduler %s ready: generation %d, members %s", self.incarnation,
                 self.core.members.generation, self.core.members.members)

    async def _lookup(self, wait_s: float) -> list[Any]:
        """Handles by name; None for a name not registered within ``wait_s``."""
        import ray

        out: list[Any] = [None] * len(self.decode_names)
        deadline = time.monotonic() + wait_s
        while True:
            for g, name in enumerate(self.decode_names):
                if out[g] is None:
                    with contextlib.suppress(ValueError):  # not registered (yet)
                        out[g] = ray.get_actor(name, namespace=self.cfg.serve.namespace)
            if all(h is not None for h in out) or time.monotonic() > deadline:
                return out
            await asyncio.sleep(0.1)

    async def _call(self, g: int, method: str, timeout_s: float) -> Any:
        """Replica ``g``'s answer to ``method``: a timeout after ``timeout_s`` only if
        the GCS does not have it ALIVE, else after ``PING_MAX_S`` (the module docstring)."""
        handle = self.decode[g]
        return await reply(getattr(handle, method).remote(), handle, self._actor_state,
                           f"decode replica {g}", method, timeout_s,
                           max(timeout_s, PING_MAX_S), who="scheduler")

    async def _report_of(self, g: int) -> ReplicaReport | None:
        """Its latest report, None if it gives none: never a death (the ping before
        said it lives), but a missing one costs the adoption of the running generation
        (all ranks then rejoin a new one) and leaves the mirror without its requests,
        so a late one of a live replica is awaited like a ping."""
        try:
            rep: ReplicaReport | None = await self._call(g, "report", PING_S)
            self.reports_by_path["pull"] += rep is not None
            return rep
        except UNAVAILABLE as exc:
            log.warning("scheduler: no report from replica %d: %s", g, exc)
            return None

    async def _ping(self, g: int, timeout_s: float | None = None) -> tuple[int, str] | None:
        """``(generation, incarnation)`` of a live replica, None if it is gone or hung
        (``timeout_s``: the first bound, ``PING_S`` if None)."""
        if self.decode[g] is None:
            return None
        try:
            _, gen, inc = await self._call(g, "ping", PING_S if timeout_s is None
                                           else timeout_s)
            return int(gen), str(inc)
        except UNAVAILABLE:
            return None
        except BUG:  # alive, but its ping is broken: log it, do not kill it
            log.exception("scheduler: ping of replica %d raised", g)
            return 0, self.core.mirror.incarnation[g]

    async def _ping_all(self, which: list[int], timeout_s: float | None = None
                        ) -> dict[int, tuple[int, str]]:
        res = await asyncio.gather(*(self._ping(g, timeout_s) for g in which))
        return {g: r for g, r in zip(which, res, strict=True) if r is not None}

    def _mark_dead(self, g: int) -> None:
        import ray

        if self.core.mirror.alive()[g]:
            log.warning("scheduler: decode replica %d is dead", g)
        self.core.mark_dead(g)
        if self.decode[g] is not None:
            with contextlib.suppress(*GONE, ValueError):
                ray.kill(self.decode[g], no_restart=True)  # a hung one must not return
        self._wake_tick()  # its unanswered dispatches are back in the pool

    async def _form_group(self, members: tuple[int, ...]) -> None:
        """Form a new generation among ``members``; drops ranks that fail to join and
        are dead, and retries (a few times) until every member joined."""
        for _ in range(5):
            gen = self.core.members.begin(members)
            if not members:
                return
            try:
                port = await asyncio.wait_for(
                    self.decode[members[0]].open_store.remote(gen), PING_S * 10)
                oks = await asyncio.wait_for(asyncio.gather(
                    *(self.decode[m].join.remote(gen, rank, members, port)
                      for rank, m in enumerate(members)), return_exceptions=True), _JOIN_S)
            except (*UNAVAILABLE, *BUG) as exc:
                log.warning("scheduler: forming generation %d failed: %s", gen, exc)
                oks = [False] * len(members)
            if all(ok is True for ok in oks):
                self._announce_reports(members)
                return
            alive = await self._ping_all(list(members))
            for g in members:
                if g not in alive:
                    self._mark_dead(g)
            members = tuple(sorted(alive))
        log.error("scheduler: could not form a barrier group among %s", members)

    async def _reform(self, generation: int | None = None) -> None:
        """Check every replica and form a new generation among the live ones (skipped
        when ``generation`` is already superseded)."""
        assert self._group_lock is not None
        async with self._group_lock:
            if generation is not None and generation < self.core.members.generation:
                return
            pings = await self._ping_all([g for g, h in enumerate(self.decode)
                                          if h is not None])
            for g in range(len(self.decode)):
                if g in pings:
                    self.core.mark_alive(g, pings[g][1])
                elif self.decode[g] is not None:
                    self._mark_dead(g)
            await self._form_group(tuple(sorted(pings)))
        self._wake_tick()

    # -- dispatch ---------------------------------------------------------------------
    def _send(self, dispatches: list[Dispatch]) -> None:
        for d in dispatches:
            self._timeline.mark(d.admission.request_id, "bound", replica=d.replica)
            ref = self.decode[d.replica].admit.remote(d.admission)
            self._spawn(self._confirm(d, ref))

    async def _confirm(self, d: Dispatch, ref: Any) -> None:
        """The replica's answer to one dispatch; a refused or failed one goes back."""
        reply: AdmitReply | None = None
        try:
            reply = await asyncio.wait_for(ref, ADMIT_S)
        except UNAVAILABLE as exc:
            log.warning("scheduler: dispatch of %s to %d failed: %s",
                        d.admission.request_id, d.replica, exc)
            self._spawn(self._reform(self.core.members.generation))
        except BUG:
            log.exception("scheduler: admit of %s on %d raised", d.admission.request_id,
                          d.replica)
        if self.core.answered(d, reply):
            self._wake_tick()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
