"""Decode replica actor: owns one replica's engine and load, decodes in lock-step.

Threads: Ray's event loop serves the RPCs (``admit``, ``poll``, ``join``...); one step
thread owns the engine and runs ``engine.step()`` followed by the barrier collective.
They meet only through locked queues: admissions flow in, token events flow out.

Contracts:
- ``admit`` pulls the KV through the transport (late binding), then queues the request;
  the step thread installs it at the start of the next step. Admitting an id twice is
  a no-op that returns True (resubmission after a scheduler restart is idempotent);
  a full replica returns False.
- Every KV handle ``admit`` takes is released exactly once, through the transport and
  the keeper: after the pull, or after a failed pull. A refused admission keeps it
  (the scheduler retries elsewhere).
- Every step ends in ``Barrier.exchange`` of the (load, running) each member computed
  that step with; afterwards the replica reports those rows plus its post-step state
  (:class:`ReplicaReport`) to the scheduler, fire-and-forget.
- Events for a request go to the outbox of its ``owner`` (an ingress replica), which
  long-polls them with :meth:`DecodeReplica.poll`. An ``Admitted`` event precedes its
  tokens; a request that cannot continue ends with a ``StreamError``.
- On a barrier failure the replica stops stepping, tells the scheduler, and waits for
  ``join`` of a newer generation; its requests stay installed and resume.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from typing import Any

from br_serve.engine.base import TokenEvent
from br_serve.serve.barrier import Barrier, BarrierError, open_store
from br_serve.serve.messages import Admission, Admitted, ReplicaReport, StreamError, StreamEvent
from br_serve.transport.base import KVHandle

log = logging.getLogger(__name__)

#: Idle replicas still report this often, so a restarted scheduler hears from them.
_IDLE_REPORT_S = 1.0


class DecodeReplica:
    """One decode replica ``index`` of ``replicas``; see the module docstring."""

    def __init__(self, index: int, config: dict[str, Any], scheduler_name: str) -> None:
        from br_serve.engine.factory import collective_backend_for, make_engine, make_transport
        from br_serve.serve.config import parse_graph_config

        self.cfg = parse_graph_config(config)
        self.index = index
        self.slots = self.cfg.slots
        self.scheduler_name = scheduler_name
        self.engine = make_engine(self.cfg, self.cfg.engine_timing(index), self.cfg.slots,
                                  self.cfg.seed)
        self.transport = make_transport(self.cfg.transport, self.cfg.mooncake_master)
        self.backend = collective_backend_for(self.cfg.device)
        self._lock = threading.Lock()
        self._wake_step = threading.Condition(self._lock)
        self._admit_q: collections.deque[_WithKV] = collections.deque()
        self._abort_q: collections.deque[str] = collections.deque()
        self._owner: dict[str, str] = {}  # request id -> ingress owner, while installed/queued
        self._outbox: dict[str, list[StreamEvent]] = collections.defaultdict(list)
        self._barrier: Barrier | None = None
        self._pending_join: tuple[int, int, tuple[int, ...], int, asyncio.Future[bool]
                                  ] | None = None
        self._store: Any = None
        self._store_gen = -1
        self._generation = 0
        self._step = 0
        self._stop = False
        self._last: ReplicaReport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set by the first admit
        self._poll_wake: dict[str, asyncio.Event] = {}
        self._scheduler: Any = None
        self._keeper: Any = None
        self._thread = threading.Thread(target=self._run, name=f"decode-{index}", daemon=True)
        self._thread.start()

    # -- RPCs ------------------------------------------------------------------------
    async def ping(self) -> tuple[int, int]:
        """``(index, generation)``: alive and which barrier generation it is in."""
        return self.index, self._generation

    async def open_store(self, generation: int) -> int:
        """Host the store of ``generation`` (called on the group's rank 0); returns its port."""
        store, port = await asyncio.to_thread(open_store, "127.0.0.1", generation,
                                              self.cfg.barrier_timeout_s)
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
            if generation <= self._generation and self._barrier is not None:
                return generation == self._generation
            if self._pending_join is not None:  # superseded before it was taken
                self._pending_join[4].get_loop().call_soon_threadsafe(
                    _resolve, self._pending_join[4], False)
            self._pending_join = (generation, rank, tuple(members), port, done)
            self._wake_step.notify_all()
        return await done

    async def admit(self, item: Admission) -> bool:
        """Pull the KV and queue ``item``; see the module docstring for the contract."""
        self._loop = asyncio.get_running_loop()
        with self._lock:
            if item.request_id in self._owner:
                return True
            queued = len(self._admit_q) + self.engine.running()
            if queued >= self.slots:
                return False
            self._owner[item.request_id] = item.owner
        try:
            if item.kv.transport == "objref" and item.kv.ref is not None:
                kv = await item.kv.ref  # same as ObjectRefTransport.get, without a thread
            else:
                kv = await asyncio.to_thread(self.transport.get, item.kv)
        except Exception as exc:  # KV lost: the request cannot run here
            with self._lock:
                self._owner.pop(item.request_id, None)
            self._emit(item.owner, [StreamError(item.request_id, f"kv pull failed: {exc}",
                                                retryable=True)])
            # the ingress re-prefills under a new id, so nobody pulls this key again
            await self._release_handle(item.kv)
            return True
        # Admitted goes out before the step thread can produce this request's tokens.
        self._emit(item.owner, [Admitted(item.request_id, self.index)])
        with self._lock:
            self._admit_q.append(_WithKV(item, kv))
            self._wake_step.notify_all()
        await self._release_handle(item.kv)
        return True

    async def release_kv(self, handle: KVHandle) -> None:
        """Free ``handle``'s source copy for a caller without a transport of its own
        (the ingress, when a request is dropped before any replica pulled its KV)."""
        await self._release_handle(handle)

    async def abort(self, request_id: str) -> None:
        with self._lock:
            self._abort_q.append(request_id)

    async def poll(self, owner: str, timeout_s: float = 1.0) -> list[StreamEvent]:
        """Events for ``owner`` since its last poll; waits up to ``timeout_s`` for some."""
        ev = self._poll_wake.setdefault(owner, asyncio.Event())
        if not self._outbox.get(owner):
            ev.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout_s)
        with self._lock:
            out = self._outbox.pop(owner, [])
        return out

    async def report(self) -> ReplicaReport | None:
        """The latest measured state (used to rebuild a restarted scheduler's mirror)."""
        return self._last

    async def shutdown(self) -> None:
        with self._lock:
            self._stop = True
            self._wake_step.notify_all()

    # -- internals -------------------------------------------------------------------
    def _emit(self, owner: str, events: list[StreamEvent]) -> None:
        with self._lock:
            self._outbox[owner].extend(events)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_owner, owner)

    def _wake_owner(self, owner: str) -> None:
        ev = self._poll_wake.get(owner)
        if ev is not None:
            ev.set()

    async def _release_handle(self, handle: KVHandle) -> None:
        """Free the source copy of ``handle`` (called once per handle this replica took).

        Both halves are needed: the keeper holds object refs (objref), the transport
        holds keys (Mooncake keeps a key until removed, and a store full of them fails
        every put). Failures are logged, never raised: the request is unaffected, and
        for objref the keeper's TTL frees it eventually.
        """
        self._release_kv(handle.key)
        try:
            if handle.transport == "objref":
                self.transport.release(handle)  # a no-op: no thread hop for it
            else:
                await asyncio.to_thread(self.transport.release, handle)
        except Exception as exc:
            log.warning("replica %d: releasing kv %r failed: %s", self.index, handle.key, exc)

    def _release_kv(self, key: str) -> None:
        """The KV is here now: let the prefill side's keeper drop its reference."""
        try:
            if self._keeper is None:
                from br_serve.serve.kvkeeper import get_keeper

                self._keeper = get_keeper(self.cfg.app_name, self.cfg.namespace, 5.0)
            self._keeper.release.remote(key)
        except Exception as exc:  # the TTL frees it eventually
            log.debug("replica %d: kv release failed: %s", self.index, exc)

    def _sched(self) -> Any:
        if self._scheduler is None:
            import ray

            self._scheduler = ray.get_actor(self.scheduler_name, namespace=self.cfg.namespace)
        return self._scheduler

    def _tell_scheduler(self, method: str, *args: Any) -> None:
        try:
            getattr(self._sched(), method).remote(*args)
        except Exception as exc:  # scheduler restarting: it rebuilds from report()
            self._scheduler = None
            log.debug("replica %d: %s to scheduler failed: %s", self.index, method, exc)

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
                              self.cfg.barrier_timeout_s, store=store)
            with self._lock:
                self._barrier, self._generation = barrier, gen
        except BarrierError as exc:
            log.warning("replica %d: %s", self.index, exc)
            ok = False
        done.get_loop().call_soon_threadsafe(_resolve, done, ok)

    def _run(self) -> None:
        finished: list[tuple[str, int]] = []
        last_report = 0.0
        while True:
            with self._lock:
                while not self._stop and self._barrier is None and self._pending_join is None:
                    self._wake_step.wait(0.5)
                if self._stop:
                    return
            if self._pending_join is not None:
                self._take_join()
                continue
            self._install()
            # the barrier carries what this step computed with (its load, and its
            # running requests = tokens it produces): the step's cost and the imbalance
            # the barrier waited for; the post-step state goes to the scheduler's mirror
            step_load, step_running = self.engine.load_tokens(), self.engine.running()
            t0 = time.perf_counter()
            events = self.engine.step()
            t1 = time.perf_counter()
            barrier = self._barrier
            assert barrier is not None
            try:
                rows = barrier.exchange(step_load, step_running)
            except BarrierError as exc:
                log.warning("replica %d: %s", self.index, exc)
                rows = None
            t2 = time.perf_counter()
            self._step += 1
            self._deliver(events, finished)
            if rows is None:
                with self._lock:
                    self._barrier = None
                barrier.close()
                self._tell_scheduler("barrier_failed", self.index, barrier.generation)
            rep = self._make_report(finished, barrier, rows, t1 - t0, t2 - t1)
            self._last = rep
            # every member reports every step while any member is busy, so the
            # scheduler can tick once per step on a complete view
            busy = bool(rep.running_ids or rep.finished_ids or sum(rep.barrier_running))
            if busy or t2 - last_report > _IDLE_REPORT_S:
                self._tell_scheduler("report", rep)
                last_report = t2
                finished = []

    def _install(self) -> None:
        with self._lock:
            items = list(self._admit_q)
            self._admit_q.clear()
            aborts = list(self._abort_q)
            self._abort_q.clear()
        for rid in aborts:
            self.engine.abort(rid)
            with self._lock:
                self._owner.pop(rid, None)
        for w in items:
            a = w.item
            try:
                self.engine.admit(a.request_id, w.kv, a.prompt_tokens, a.first_token_id,
                                  a.params)
            except Exception as exc:
                with self._lock:
                    owner = self._owner.pop(a.request_id, a.owner)
                self._emit(owner, [StreamError(a.request_id, f"admit failed: {exc}")])

    def _deliver(self, events: list[TokenEvent], finished: list[tuple[str, int]]) -> None:
        by_owner: dict[str, list[StreamEvent]] = collections.defaultdict(list)
        with self._lock:
            for e in events:
                owner = self._owner.get(e.request_id)
                if e.finished:
                    self._owner.pop(e.request_id, None)
                    finished.append((e.request_id, e.index + 1))
                if owner is not None:
                    by_owner[owner].append(e)
        for owner, evs in by_owner.items():
            self._emit(owner, evs)

    def _make_report(self, finished: list[tuple[str, int]], barrier: Barrier,
                     rows: Any, compute_s: float, barrier_s: float) -> ReplicaReport:
        ids = tuple(self.engine.running_ids())
        prompts = tuple(self._prompt_of(r) for r in ids)
        decoded = tuple(self._decoded_of(r) for r in ids)
        return ReplicaReport(
            replica=self.index, generation=barrier.generation, step=self._step,
            load_tokens=int(self.engine.load_tokens()), running_ids=ids,
            prompt_tokens=prompts, decoded_tokens=decoded,
            finished_ids=tuple(f[0] for f in finished),
            finished_output_tokens=tuple(f[1] for f in finished),
            members=barrier.members,
            barrier_loads=() if rows is None else tuple(int(x) for x in rows[:, 0]),
            barrier_running=() if rows is None else tuple(int(x) for x in rows[:, 1]),
            compute_s=compute_s, barrier_s=barrier_s)

    def _prompt_of(self, rid: str) -> int:
        fn = getattr(self.engine, "prompt_tokens_of", None)
        return int(fn(rid)) if fn else 0

    def _decoded_of(self, rid: str) -> int:
        fn = getattr(self.engine, "decoded_steps", None)
        return int(fn(rid)) if fn else 0


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


class _WithKV:
    """An admission whose KV has been pulled (internal to the replica; not a message)."""

    __slots__ = ("item", "kv")

    def __init__(self, item: Admission, kv: Any) -> None:
        self.item = item
        self.kv = kv
