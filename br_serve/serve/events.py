"""The ingress Streamer's background I/O: event long-polls, replica replacement, and the
scheduler watch (a mixin of :class:`br_serve.serve.streams.Streamer`).

- One long-poll loop per decode replica fetches every event for this owner and routes
  it to the request's queue (a step costs one RPC per replica, not one per token).
- A poll that fails (the replica died) or hangs past ``_POLL_S`` marks the replica
  lost: each request placed on it gets a ``_Lost`` item (its stream re-prefills), the
  scheduler is told, and the replica is replaced by a new actor of the same name, which
  the scheduler then takes into a new barrier generation; polling resumes on it.
- The scheduler watch reads the scheduler's summary every ``_WATCH_S``: a changed
  incarnation (a restart) makes the Streamer resubmit its unconfirmed pool entries; the
  counts feed the overload gate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from br_serve.serve.gate import AdmissionGate
from br_serve.serve.messages import Admission, Admitted
from br_serve.serve.rpc import BUG, GONE, TIMEOUT, UNAVAILABLE
from br_serve.serve.sched_io import SchedulerUnavailable

log = logging.getLogger(__name__)

_POLL_S = 15.0
_WATCH_S = 0.5
_SCHEDULER_RETRY_S = 60.0

#: ``replace(g, old_handle)`` -> a live handle for decode replica ``g``
Replacer = Callable[[int, Any], Awaitable[Any]]


class GenerateError(Exception):
    """A request failed before streaming began; ``status`` is the HTTP status and
    ``retry_after_s`` (for 429) when to try again."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class _Lost:
    """Internal queue item: the replica running the request is gone."""

    replica: int


class Inbox:
    """One request's incoming events, handed over all at once (a step's worth, or more
    when the stream fell behind), without an asyncio task per event."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        self._items.append(item)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def take(self, timeout_s: float) -> list[Any]:
        """Everything queued; waits up to ``timeout_s`` for something ([] if nothing)."""
        if not self._items:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self._waiter = fut
            timer = loop.call_later(timeout_s, _wake, fut)
            try:
                await fut
            finally:
                timer.cancel()
                self._waiter = None
        out, self._items = self._items, []
        return out


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class StreamerIO:
    """See the module docstring. Set up by :meth:`_io_init`."""

    owner: str
    gate: AdmissionGate

    def _io_init(self, scheduler: Any, decode: list[Any], replace: Replacer | None) -> None:
        self._scheduler = scheduler
        self._decode = list(decode)
        self._replace = replace
        self._queues: dict[str, Inbox] = {}
        self._placement: dict[str, int] = {}
        self._pending: dict[str, Admission] = {}
        self._dead: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._incarnation: str | None = None

    def _ensure_started(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._poll_loop(g)) for g in range(len(self._decode))]
        self._tasks.append(loop.create_task(self._watch_scheduler()))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()

    # -- decode replicas ----------------------------------------------------------
    async def _poll_loop(self, g: int) -> None:
        while True:
            handle = self._decode[g]
            try:
                events = await asyncio.wait_for(handle.poll.remote(self.owner, 1.0), _POLL_S)
            except (*GONE, *TIMEOUT) as exc:
                log.warning("ingress: lost decode replica %d: %s", g, exc)
                if not await self._lost(g, handle):
                    return
                continue
            except BUG:
                log.exception("ingress: poll of replica %d raised", g)
                await asyncio.sleep(1.0)
                continue
            for ev in events:
                rid = ev[0] if type(ev) is tuple else ev.request_id  # tokens are tuples
                q = self._queues.get(rid)
                if q is not None:
                    q.put(ev)
                elif isinstance(ev, Admitted):
                    # nobody waits for it any more (client gone): free the slot
                    handle.abort.remote(rid)

    async def _lost(self, g: int, handle: Any) -> bool:
        """Replica ``g`` is gone: end its streams' attempts, replace it. False when
        there is nothing to replace it with (then its poll loop ends)."""
        self._dead.add(g)
        for rid, where in list(self._placement.items()):
            if where == g and rid in self._queues:
                self._queues[rid].put(_Lost(g))
        self._scheduler.replica_lost.remote(g)
        if self._replace is None:
            return False
        while True:
            try:
                new = await self._replace(g, handle)
                break
            except RuntimeError as exc:
                log.error("ingress: %s; retrying", exc)
                await asyncio.sleep(5.0)
        self._decode[g] = new
        self._dead.discard(g)
        self._scheduler.replica_replaced.remote(g)
        return True

    # -- the scheduler --------------------------------------------------------------
    async def _watch_scheduler(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_S)
            try:
                summary = await asyncio.wait_for(self._scheduler.summary.remote(), 5.0)
            except UNAVAILABLE:
                continue
            except BUG:
                log.exception("ingress: scheduler summary raised")
                continue
            if summary is None:
                continue  # still starting
            self.gate.observe(summary["alive"], summary["requests"])
            inc = summary["incarnation"]
            if self._incarnation is not None and inc != self._incarnation:
                log.warning("ingress: scheduler restarted; resubmitting %d entries",
                            len(self._pending))
                for entry in list(self._pending.values()):
                    try:
                        await self._call_scheduler("submit", entry)
                    except GenerateError as exc:  # its watchdog retries later
                        log.warning("ingress: resubmitting %s failed: %s",
                                    entry.request_id, exc)
            self._incarnation = inc

    async def _call_scheduler(self, method: str, *args: Any) -> Any:
        """Call the scheduler, riding out a restart (bounded).

        Raises:
            GenerateError: 503 when it stays unreachable or says it is not ready,
                500 when the call itself failed (a bug on its side).
        """
        deadline = time.monotonic() + _SCHEDULER_RETRY_S
        while True:
            try:
                return await getattr(self._scheduler, method).remote(*args)
            except SchedulerUnavailable as exc:  # raised inside it: a RayTaskError too
                raise GenerateError(503, f"scheduler unavailable: {exc}",
                                    "service_unavailable") from exc
            except GONE as exc:
                if time.monotonic() > deadline:
                    raise GenerateError(503, f"scheduler unavailable: {exc}",
                                        "service_unavailable") from exc
                await asyncio.sleep(0.2)
            except BUG as exc:
                log.exception("ingress: scheduler.%s raised", method)
                raise GenerateError(500, f"scheduler error: {exc}", "server_error") from exc
