"""Decode replica actor: owns one replica's engine and load, decodes in lock-step.

A thin shell over :class:`~br_serve.serve.replica.core.ReplicaCore`, which makes every
decision (admission into slots, aborts, installs, what a step's events and failures
mean, when and what to report; tested without Ray): this module only does the I/O
(Ray RPCs, the KV pull, the engine, the barrier, outboxes and channels, the scheduler).

Threads: Ray's event loop serves the RPCs (``admit``, ``poll``, ``join``...); one step
thread owns the engine and runs ``engine.step()`` followed by the barrier collective.
They meet only through the lock-guarded core (admissions in, finished and dropped ids
out) and the owners' outboxes (token events out).

Contracts:
- ``admit`` reserves a slot, pulls the KV through the :class:`KVLease` (late binding),
  then queues the request; the step thread installs it at the start of the next step.
  It answers an :class:`AdmitReply`: ``queued``, ``duplicate`` (admitting an id twice is
  a no-op: resubmission after a scheduler restart is idempotent), ``full`` (refused;
  the KV is untouched and the scheduler retries elsewhere) or ``failed`` (the pull
  failed; the owner gets a retryable :class:`StreamError`). Every request it took
  ends finished or dropped in a later report (:mod:`br_serve.serve.replica.book`).
- Every KV handle ``admit`` pulls (or fails to pull) is released once, through the lease.
- Every step ends in ``Barrier.exchange`` of the (load, running) each member computed
  that step with, whether it reports this step, and the compute time it measured for
  the step (``engine.step()`` alone, not the barrier wait, which is the others' time).
  When the policy calibrates step costs online, rank 0's report carries every
  member's compute time (``barrier_compute_s``); otherwise it is left out. A replica
  reports (fire-and-forget) only what changed (installed, finished, dropped requests;
  the scheduler's mirror advances running requests itself) plus a periodic full state;
  the group's rank 0 reports every busy step with the exchanged rows of all members
  (:class:`ReportClock`, :class:`ReplicaReport`). A group with nothing to run waits
  for admissions instead of stepping idle.
- Events for a request go to the outbox of its ``owner`` (an ingress replica), which
  long-polls them with :meth:`DecodeReplica.poll` until the poll hands over the
  owner's event channel (:mod:`br_serve.serve.wire.channel`); then a pusher writes them to
  it and the poll only shows liveness. An ``Admitted`` event precedes its tokens; a
  request that cannot continue ends with a ``StreamError``.
- On a barrier failure the replica stops stepping, tells the scheduler, and waits for
  ``join`` of a newer generation; its requests stay installed and resume.
- A fault of the engine itself (anything but the ``ValueError`` of a bad request) ends
  the process: a replica that cannot step must look dead, so that it is replaced,
  rather than keep answering pings while its peers' barrier times out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from br_serve.engine.base import DecodeEngine
from br_serve.serve.metrics import RequestTimeline
from br_serve.serve.replica.barrier import Barrier, BarrierError, open_store
from br_serve.serve.replica.core import Outgoing, ReplicaCore
from br_serve.serve.wire.channel import ChannelSpec, OwnerChannels, ReportPusher, encode_report
from br_serve.serve.wire.messages import Admission, AdmitReply, ReplicaReport, WireEvent
from br_serve.transport.base import TransportError
from br_serve.transport.lease import KVLease

if TYPE_CHECKING:
    from br_serve.serve.config import GraphConfig

log = logging.getLogger(__name__)

#: An idle group steps this often at most (an admission wakes a replica at once).
_IDLE_WAIT_S = 0.05


class DecodeReplica:
    """One decode replica ``index`` of ``replicas``; see the module docstring."""

    def __init__(self, index: int, cfg: GraphConfig, scheduler_name: str) -> None:
        from br_serve.engine.factory import collective_backend_for, make_engine
        from br_serve.engine.remote import remote_rank
        from br_serve.transport.factory import make_transport
        from br_serve.transport.keeper import get_keeper

        self.cfg = cfg
        self.index = index
        self.incarnation = uuid.uuid4().hex[:12]
        self.scheduler_name = scheduler_name
        self.engine: DecodeEngine = (
            remote_rank(cfg.remote, index) if cfg.is_remote
            else make_engine(cfg.engine, cfg.engine_timing(index), cfg.slots, cfg.seed))
        self.lease = KVLease(make_transport(cfg.kv_transport(), cfg.transport.mooncake_master,
                                            api_key=cfg.remote.api_key),
                             find_keeper=lambda: get_keeper(cfg.serve.app_name,
                                                            cfg.serve.namespace, 5.0))
        #: what the engine declares beyond the base contract (a remote rank: both)
        self._caps = self.engine.capabilities
        self.backend = collective_backend_for(cfg.engine.device)
        self._lock = threading.Lock()
        self._wake_step = threading.Condition(self._lock)
        #: the decisions (under ``_lock``); rank 0's reports carry every member's step
        #: compute time only when the scheduler calibrates step costs online
        self._timeline = RequestTimeline()  # admission, KV pull, install per request
        self.core = ReplicaCore(index, self.incarnation, cfg.places_per_replica(),
                                with_compute=cfg.policy.needs().calibrated_step_costs)
        self._outbox: dict[str, list[WireEvent]] = collections.defaultdict(list)
        self._barrier: Barrier | None = None
        self._pending_join: tuple[int, int, tuple[int, ...], int, asyncio.Future[bool]
                                  ] | None = None
        self._store: Any = None
        self._store_gen = -1
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None  # set by the first RPC
        self._poll_wake: dict[str, asyncio.Event] = {}
        self._channels = OwnerChannels(self._take_events)
        self._reports: ReportPusher | None = None  # the scheduler's report channel
        self._reports_used: ReportPusher | None = None
        self._scheduler: Any = None
        #: what a fault of the step thread does (tests replace it: it ends the process)
        self.on_fatal: Any = _exit_process
        self._thread = threading.Thread(target=self._run, name=f"decode-{index}", daemon=True)
        self._thread.start()

    # -- RPCs ------------------------------------------------------------------------
    async def ping(self) -> tuple[int, int, str]:
        """``(index, generation, incarnation)``: alive, in which barrier generation,
        and which actor instance (a replacement has a new one)."""
        self._loop = asyncio.get_running_loop()
        return self.index, self.core.generation, self.incarnation

    async def open_store(self, generation: int) -> int:
        """Host the store of ``generation`` (called on the group's rank 0); returns its port."""
        store, port = await asyncio.to_thread(open_store, "127.0.0.1", generation,
                                              self.cfg.serve.barrier_timeout_s)
        with self._lock:
            self._store, self._store_gen = store, generation
        return port

    async def join(self, generation: int, rank: int, members: tuple[int, ...],
                   port: int) -> bool:
        """Leave the current generation and join ``generation`` as ``rank`` of ``members``.

        Returns once the group is connected (True) or the join failed (False).
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        done: asyncio.Future[bool] = loop.create_future()
        with self._lock:
            answer = self.core.join_answer(generation, self._barrier is not None)
            if answer is not None:
                return answer
            if self._pending_join is not None:  # superseded before it was taken
                self._pending_join[4].get_loop().call_soon_threadsafe(
                    _resolve, self._pending_join[4], False)
            self._pending_join = (generation, rank, tuple(members), port, done)
            self._wake_step.notify_all()
        return await done

    async def admit(self, item: Admission) -> AdmitReply:
        """Take ``item``: reserve a slot, pull its KV, queue it (see the module docstring)."""
        self._loop = asyncio.get_running_loop()
        self._timeline.mark(item.request_id, "admit_in")
        with self._lock:
            refused = self.core.accept(item)
        if refused is not None:
            return refused
        try:
            kv = await self.lease.pull(item.kv)
            self._timeline.mark(item.request_id, "kv_pulled")
        except TransportError as exc:  # KV lost: the request cannot run here
            with self._lock:
                out, reply = self.core.pull_failed(item, str(exc))
            self._emit_all(out)
            self.lease.release(item.kv)  # nobody pulls this key again (re-prefill: new id)
            return reply
        # Admitted goes out before the step thread can produce this request's tokens.
        self._emit_all(self.core.admitted(item))
        with self._lock:
            taken, reply = self.core.pulled(item, kv)  # not taken: aborted meanwhile
            self._wake_step.notify_all()
        if self._caps.wakes_on_admit:  # a remote rank's step may be waiting for tokens
            self.engine.nudge()
        # taken: the engine frees a remote source itself once it pulled it
        self.lease.release(item.kv, consumed=taken)
        return reply

    async def report_to(self, spec: ChannelSpec) -> None:
        """Send reports over the scheduler's report channel ``spec`` from now on (a
        channel that cannot connect or breaks: through Ray, as before)."""
        self._loop = asyncio.get_running_loop()
        cur, spec = self._reports, tuple(spec)  # type: ignore[assignment]
        if cur is not None and cur.spec == spec and cur.state in ("connecting", "open"):
            return
        if cur is not None:
            cur.close()
        self._reports = ReportPusher(spec, (self.index, self.incarnation, 0))
        self._reports.start()

    async def abort(self, request_id: str) -> None:
        """The owner gave ``request_id`` up: free its slot (no-op if not held here)."""
        with self._lock:
            self.core.abort(request_id)
            self._wake_step.notify_all()

    async def poll(self, owner: str, timeout_s: float = 1.0,
                   channel: ChannelSpec | None = None, poll_no: int = 0) -> list[WireEvent]:
        """Events for ``owner`` since its last poll (tokens as :data:`WireToken` tuples);
        waits up to ``timeout_s`` for some. With ``channel`` (the owner's event channel,
        this poll numbered ``poll_no``) the first such poll answers what is queued and
        hands the owner over to the channel; later polls wait ``timeout_s`` and answer
        nothing (liveness), unless the channel could not connect."""
        self._loop = asyncio.get_running_loop()
        if self._channels.pushing(owner):
            await asyncio.sleep(timeout_s)
            return []
        if channel is not None and self._channels.can_open(owner):
            return self._channels.open(owner, tuple(channel),  # type: ignore[arg-type]
                                       (self.index, self.incarnation, poll_no))
        ev = self._poll_wake.setdefault(owner, asyncio.Event())
        if not self._outbox.get(owner):
            ev.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout_s)
        return self._take_events(owner)

    def _take_events(self, owner: str) -> list[WireEvent]:
        with self._lock:
            return self._outbox.pop(owner, [])

    async def timeline(self) -> dict[str, Any]:
        """Each request's admission, KV pull and install time (:class:`RequestTimeline`)."""
        return self._timeline.snapshot()

    async def proc_stats(self) -> dict[str, float]:
        """This process's CPU seconds, the steps run so far, the owners whose events go
        over an open event channel and whether reports do (for benchmarks and tests)."""
        rc = self._reports
        return {"cpu_s": time.process_time(), "steps": float(self.core.step),
                "channels_open": float(self._channels.open_count()),
                "reports_open": float(rc is not None and rc.state == "open")}

    async def report(self) -> ReplicaReport | None:
        """The latest full state (used to rebuild a restarted scheduler's mirror)."""
        return self.core.last

    async def shutdown(self) -> None:
        with self._lock:
            self._stop = True
            self._wake_step.notify_all()

    # -- internals -------------------------------------------------------------------
    def _emit_all(self, out: Outgoing) -> None:
        for owner, events in out.items():
            self._emit(owner, events)

    def _emit(self, owner: str, events: list[WireEvent]) -> None:
        if self._channels.broken(owner):
            return  # that owner treats this replica as lost (or is gone itself)
        with self._lock:
            self._outbox[owner].extend(events)
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed (tests)
                loop.call_soon_threadsafe(self._wake_owner, owner)

    def _wake_owner(self, owner: str) -> None:
        ev = self._poll_wake.get(owner)
        if ev is not None:
            ev.set()
        self._channels.wake(owner)

    def _sched(self) -> Any:
        if self._scheduler is None:
            import ray

            self._scheduler = ray.get_actor(self.scheduler_name, namespace=self.cfg.serve.namespace)
        return self._scheduler

    def _tell_scheduler(self, method: str, *args: Any) -> bool:
        """Fire-and-forget call (a report over the report channel when it is open); False
        if the scheduler could not be found (restarting: it rebuilds from
        :meth:`report`) or the channel lost a report (the next one goes in full)."""
        rc, loop = self._reports, self._loop
        if method == "report" and rc is not None:
            if rc.lost:
                rc.lost = False
                return False
            if rc.state == "open" and loop is not None:
                loop.call_soon_threadsafe(rc.send, encode_report(args[0]))
                return True
        try:
            getattr(self._sched(), method).remote(*args)
            return True
        except ValueError as exc:  # not registered (restarting)
            self._scheduler = None
            log.debug("replica %d: %s to scheduler failed: %s", self.index, method, exc)
            return False

    def _take_join(self) -> None:
        """Apply a pending ``join`` (runs on the step thread; blocks until all ranks join)."""
        with self._lock:
            pending, self._pending_join = self._pending_join, None
            store = self._store if pending and self._store_gen == pending[0] else None
        if pending is None:
            return
        gen, rank, members, port, done = pending
        if self._barrier is not None:
            self._barrier.close()
            self._barrier = None
        ok = True
        try:
            barrier = Barrier(self.backend, "127.0.0.1", port, rank, members, gen,
                              self.cfg.serve.barrier_timeout_s, store=store)
            with self._lock:
                self._barrier = barrier
                self.core.joined(gen)
        except BarrierError as exc:
            log.warning("replica %d: %s", self.index, exc)
            ok = False
        done.get_loop().call_soon_threadsafe(_resolve, done, ok)

    def _run(self) -> None:
        try:
            self._loop_steps()
        except BaseException:  # an engine fault: look dead, so the replica is replaced
            log.exception("replica %d: step thread failed; exiting", self.index)
            self.on_fatal()

    def _loop_steps(self) -> None:
        idle = False  # the last exchange showed no member running anything
        while True:
            with self._lock:
                while not self._stop and self._barrier is None and self._pending_join is None:
                    self._wake_step.wait(0.5)
                if self._stop:
                    return
                if idle and self._pending_join is None and not self.core.has_work():
                    # nothing to run anywhere: wait for an admission (or a peer, which
                    # then waits at most this long at the barrier) instead of spinning
                    self._wake_step.wait(_IDLE_WAIT_S)
            if self._pending_join is not None:
                self._take_join()
                idle = False
                continue
            rows = self._one_step()
            idle = rows is not None and not rows[:, 1].any() and not self.engine.running()

    def _one_step(self) -> Any:
        """Install, step, exchange, deliver, report. Returns the barrier rows (None if
        the collective failed)."""
        self._install()
        barrier = self._barrier
        assert barrier is not None
        # the barrier carries what this step computed with (its load, and its running
        # requests = tokens it produces): the step's cost and the imbalance the
        # barrier waited for; the post-step state goes to the scheduler's mirror
        step_load, step_running = self.engine.load_tokens(), self.engine.running()
        t0 = time.perf_counter()
        events = self.engine.step()
        t1 = time.perf_counter()
        failures = self.engine.take_failures() if self._caps.fails_streams else []
        rc = self._reports
        fresh = rc is not None and rc is not self._reports_used and rc.state == "open"
        if fresh:
            self._reports_used = rc  # a new channel starts with a full report
        with self._lock:
            news = self.core.after_step(events, failures, barrier_step=barrier.steps + 1,
                                        now_s=t1, fresh_channel=fresh)
        try:
            rows = barrier.exchange(step_load, step_running, int(news.report), t1 - t0)
        except BarrierError as exc:
            log.warning("replica %d: %s", self.index, exc)
            rows = None
        t2 = time.perf_counter()
        self._emit_all(news.events)
        with self._lock:
            self.core.count_step()
            if rows is None:
                self._barrier = None
        if rows is None:
            barrier.close()
            self._tell_scheduler("barrier_failed", self.index, barrier.generation)
        rep = self.core.after_exchange(news, self.engine, barrier, rows,
                                       compute_s=t1 - t0, barrier_s=t2 - t1)
        if rep is not None:
            ok = self._tell_scheduler("report", rep)
            with self._lock:
                self.core.report_sent(news, ok, t2)
        return rows

    def _install(self) -> None:
        with self._lock:
            installs, aborts = self.core.take_work()
        for rid in aborts:
            self.engine.abort(rid)
        for a, kv in installs:
            self._timeline.mark(a.request_id, "installed")
            try:
                self.engine.admit(a.request_id, kv, a.prompt_tokens, a.first_token_id,
                                  a.params)
            except ValueError as exc:  # the engine cannot take this request
                with self._lock:
                    out = self.core.install_failed(a, str(exc))
                self._emit_all(out)


def _exit_process() -> None:
    logging.shutdown()
    os._exit(1)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
