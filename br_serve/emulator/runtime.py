"""The emulator's asyncio side: the lock-step step loop and the KV broker.

:class:`StepDriver` runs :class:`~br_serve.emulator.core.LockstepCore` on the event
loop: plan, sleep until the step's modelled end, apply, hand each token to the stream
of its request. Steps are scheduled on absolute deadlines, so the emulator's own CPU
time per step (measured in ``step_cpu_s``) is absorbed into the modelled step instead
of stretching it, as long as it is shorter than the step.

:class:`KVBroker` wraps the prefill role's :class:`~br_serve.emulator.ledger.KVLedger`
with the waiting a rendezvous needs (an SGLang decode may ask for a room before the
prefill has opened it) and a TTL sweeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from br_serve.emulator.core import LockstepCore, TokenEvent
from br_serve.emulator.ledger import Hold, KVLedger, KVRefused, ReleaseReason
from br_serve.emulator.steplog import StepLog

#: Put on a request's queue when its rank was dropped (fault injection).
DROPPED = None


class StepDriver:
    """Owns the core on one event loop; ``submit`` returns the request's token queue."""

    def __init__(self, core: LockstepCore, idle_poll_s: float = 0.005,
                 late_tolerance_s: float = 0.002) -> None:
        self.core = core
        #: every applied step (see :mod:`br_serve.emulator.steplog`)
        self.log = StepLog(core.model.a_s_per_token, core.model.b_s)
        self._late_tolerance_s = late_tolerance_s
        self.step_cpu_s = 0.0
        self.overrun_s = 0.0
        self._idle_poll_s = idle_poll_s
        self._queues: dict[str, asyncio.Queue[TokenEvent | None]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="step-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, rid: str, rank: int, prompt_tokens: int, max_tokens: int,
               seed: int) -> asyncio.Queue[TokenEvent | None]:
        self.core.admit(rid, rank, prompt_tokens, max_tokens, seed)
        q: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
        self._queues[rid] = q
        assert self._wake is not None, "StepDriver.start() was not called"
        self._wake.set()
        return q

    def cancel(self, rid: str) -> bool:
        """Abort ``rid`` (client gone): frees its slot; ``False`` if it already ended."""
        self._queues.pop(rid, None)
        return self.core.abort(rid)

    def drop_rank(self, rank: int) -> list[str]:
        ids = self.core.drop_rank(rank)
        for rid in ids:
            q = self._queues.pop(rid, None)
            if q is not None:
                q.put_nowait(DROPPED)
        return ids

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        next_t = loop.time()
        while True:
            if self.core.idle():
                self._wake.clear()
                await self._wake.wait()
                next_t = loop.time()
            t0 = time.perf_counter()
            plan = self.core.plan()
            self.step_cpu_s += time.perf_counter() - t0
            if plan.empty:  # only stalled ranks hold requests
                await asyncio.sleep(self._idle_poll_s)
                next_t = loop.time()
                continue
            target = next_t + plan.duration_s
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            late = loop.time() - target
            if late > self._late_tolerance_s:  # overloaded: do not try to catch up
                self.overrun_s += late
                target += late
            t0 = time.perf_counter()
            events = self.core.apply(plan)
            core = self.core
            self.log.record(time.time(), plan.duration_s, max(late, 0.0), plan.loads,
                            [len(ids) for ids in plan.running],
                            [core.waiting_count(g) for g in range(core.dp_size)])
            queues = self._queues
            for ev in events:
                q = queues.get(ev.request_id)
                if q is not None:
                    q.put_nowait(ev)
                    if ev.finished:
                        del queues[ev.request_id]
            self.step_cpu_s += time.perf_counter() - t0
            next_t = target  # this step's bookkeeping is absorbed into the next one


class KVBroker:
    """The ledger plus asyncio rendezvous: wait for a key to be issued or released."""

    def __init__(self, ledger: KVLedger) -> None:
        self.ledger = ledger
        self._issued: dict[str, asyncio.Event] = {}
        self._released: dict[str, asyncio.Event] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="kv-ttl")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    def issue(self, key: str, fields: Mapping[str, Any], prompt_tokens: int,
              rank: int) -> Hold:
        hold = self.ledger.issue(key, fields, prompt_tokens, rank)
        self._released[key] = asyncio.Event()
        ev = self._issued.pop(key, None)
        if ev is not None:
            ev.set()
        return hold

    async def pull(self, key: str, presented: Mapping[str, Any], wait_s: float) -> Hold:
        """Pull ``key``; if it was never issued, wait up to ``wait_s`` for it first."""
        try:
            # a pull that will wait is counted refused only if the key never comes
            hold = self.ledger.pull(key, presented, count_unknown=wait_s <= 0)
        except KVRefused as exc:
            if exc.reason != "unknown" or wait_s <= 0:
                raise
            ev = self._issued.setdefault(key, asyncio.Event())
            try:
                await asyncio.wait_for(ev.wait(), wait_s)
            except asyncio.TimeoutError:
                self._issued.pop(key, None)
                self.ledger.refuse("unknown")
                raise KVRefused("unknown", f"{exc} (waited {wait_s:g} s)") from None
            hold = self.ledger.pull(key, presented)
        self._notify_released(key)
        return hold

    def abort(self, key: str) -> bool:
        ok = self.ledger.abort(key)
        if ok:
            self._notify_released(key)
        return ok

    async def wait_released(self, key: str) -> ReleaseReason:
        ev = self._released.get(key)
        if ev is not None:
            await ev.wait()
        reason = self.ledger.released_reason(key)
        assert reason is not None
        return reason

    def _notify_released(self, key: str) -> None:
        ev = self._released.pop(key, None)
        if ev is not None:
            ev.set()

    async def _sweep(self) -> None:
        period = min(1.0, self.ledger.ttl_s / 4)
        while True:
            await asyncio.sleep(period)
            for key in self.ledger.expire():
                self._notify_released(key)


class Counters:
    """Request outcomes outside the core, by name (``refused``, ``kv_pulls``, ...)."""

    def __init__(self, dp_size: int) -> None:
        self.refused: dict[str, int] = {}
        #: request fields accepted and ignored (not modelled), by name
        self.ignored_fields: dict[str, int] = {}
        self.kv_pulls = [0] * dp_size
        #: prompt-keyed decodes that found no stored KV and computed the prompt
        self.kv_recomputes = [0] * dp_size
        self.prefills = [0] * dp_size
        self.prefill_ids: list[list[str]] = [[] for _ in range(dp_size)]
        self.inflight_prefills = [0] * dp_size
        self.prompt_tokens = [0] * dp_size
        #: external request id (X-Request-Id / rid) -> the internal key it runs under
        self.internal_id: dict[str, str] = {}

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


class Timeline:
    """Wall-clock (Unix s) marks of each request's hops, by key (an SGLang room):
    ``prefill_in`` / ``prefill_done`` / ``kv_released`` on a prefill role, ``decode_in``
    / ``kv_ready`` / ``first_token`` on a decode role, plus the request's ``seed`` (a
    client's join key). The first mark of a name wins; at most ``limit`` keys are kept
    (later ones are counted in ``dropped``), so a long-running emulator stays bounded."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.marks: dict[str, dict[str, float]] = {}
        self.dropped = 0

    def mark(self, key: str, name: str, **extra: float) -> None:
        row = self.marks.get(key)
        if row is None:
            if len(self.marks) >= self.limit:
                self.dropped += 1
                return
            row = self.marks[key] = {}
        row.setdefault(name, time.time())
        for k, v in extra.items():
            row.setdefault(k, v)


def process_cpu_s() -> float:
    return time.process_time()


def now_s() -> float:
    return time.monotonic()


Clock = Callable[[], float]
