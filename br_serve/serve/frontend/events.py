"""The ingress Streamer's background I/O: event long-polls, replica replacement, and the
scheduler watch (a mixin of :class:`br_serve.serve.frontend.streams.Streamer`).

- One long-poll loop per decode replica fetches every event for this owner and routes
  it to the request's queue, until its poll hands the replica over to this owner's
  event channel (:mod:`br_serve.serve.wire.channel`, when ``channel_host`` is set): then
  the replica writes the events to a TCP stream (no Ray call per step) and the poll,
  once a second, only shows that it lives. Each channel's batches are applied after
  the reply of the poll that opened it, so every stream keeps its order; a channel
  that breaks makes its replica lost, like a failed poll.
- A poll that fails because the replica died (Ray's ``GONE``) marks the replica lost:
  each request placed on it gets a ``_Lost`` item (its stream re-prefills), the
  scheduler is told, and the replica is replaced by a new actor of the same name, which
  the scheduler then takes into a new barrier generation; polling resumes on it.
- A poll that has not answered in ``_POLL_S`` is not yet a death. A loaded host can
  stall a live actor for seconds, and replacing it would re-prefill every stream on it
  and kill a working replica. The GCS is asked about it
  (:mod:`br_serve.serve.wire.liveness`): not ALIVE (or no answer) makes it lost as
  above, after ``_POLL_S`` as before. ALIVE means the same poll is awaited further,
  with a warning every ``_POLL_S``, up to ``_POLL_MAX_S`` from its start; after that
  it is lost even though its process lives. Meanwhile its streams only wait: nothing
  is re-prefilled, replaced or reported to the scheduler.
- The scheduler watch reads the scheduler's summary every ``_WATCH_S``: a changed
  incarnation (a restart) makes the Streamer resubmit its unconfirmed pool entries; the
  counts feed the overload gate.
- The graph's actors all die with their owner, the ``Actors`` replica: a scheduler or
  decode replica found dead makes the Streamer ask the owner which actors are current
  (:class:`~br_serve.serve.frontend.owner.OwnerWatch`, a mixin of this one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from br_serve.serve.frontend.gate import AdmissionGate
from br_serve.serve.frontend.owner import ACTORS_LOST, OwnerWatch, Resolver
from br_serve.serve.scheduler.io import SchedulerUnavailable
from br_serve.serve.wire.channel import ACK_S, ChannelServer, ChannelSpec
from br_serve.serve.wire.liveness import ActorState, reply
from br_serve.serve.wire.messages import Admission, Admitted
from br_serve.serve.wire.rpc import BUG, GONE, TIMEOUT
from br_serve.transport.lease import KVLease

log = logging.getLogger(__name__)

_POLL_S = 15.0
#: a poll of a replica that the GCS says is alive is awaited this long at most: the
#: scheduler kills a replica that hangs its barrier well before this (its peers time
#: out in ``serve.barrier_timeout_s``), so this bound is a backstop for one that answers
#: nothing while its barrier runs
_POLL_MAX_S = 60.0
_WATCH_S = 0.5
_SCHEDULER_RETRY_S = 60.0

#: ``replace(g, old_handle)`` -> ``(a live handle for decode replica g, owner epoch)``
Replacer = Callable[[int, Any], Awaitable[tuple[Any, str]]]


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


class StreamerIO(OwnerWatch):
    """See the module docstring. Set up by :meth:`_io_init`."""

    owner: str
    gate: AdmissionGate
    lease: KVLease

    def _io_init(self, scheduler: Any, decode: list[Any], replace: Replacer | None,
                 channel_host: str | None = None, resolve: Resolver | None = None,
                 epoch: str = "", actor_state: ActorState | None = None) -> None:
        self._scheduler = scheduler
        self._decode = list(decode)
        self._replace = replace
        self._owner_init(resolve, epoch, actor_state)
        self._queues: dict[str, Inbox] = {}
        self._placement: dict[str, int] = {}
        self._pending: dict[str, Admission] = {}
        self._dead: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._incarnation: str | None = None
        # the event channel (None: polling only); per replica: the last poll sent and
        # the last applied, the open connection, the first poll a hello may name
        self._channel_host = channel_host
        self._channel: ChannelServer | None = None
        self._channel_spec: ChannelSpec | None = None
        self._poll_sent: dict[int, int] = {}
        self._poll_applied: dict[int, int] = {}
        self._applied_ev: dict[int, asyncio.Event] = {}
        self._chan_conn: dict[int, object] = {}
        self._chan_from: dict[int, int] = {}
        self._chan_broken: set[int] = set()

    def _ensure_started(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        if self._channel_host is not None:
            self._tasks.append(loop.create_task(self._open_channel(self._channel_host)))
        self._tasks += [loop.create_task(self._poll_loop(g)) for g in range(len(self._decode))]
        self._tasks.append(loop.create_task(self._watch_scheduler()))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._channel is not None:
            await self._channel.close()

    # -- the event channel ------------------------------------------------------------
    async def _open_channel(self, host: str) -> None:
        server = ChannelServer(host, self._chan_ready, self._chan_events, self._chan_closed)
        try:
            self._channel_spec = await server.start()
            self._channel = server
            log.info("ingress %s: event channel on %s:%d", self.owner, host, server.port)
        except OSError as exc:
            log.warning("ingress: no event channel on %s (%s); polling only", host, exc)

    async def _chan_ready(self, g: int, poll_no: int, conn: object) -> bool:
        """A replica's hello names the poll whose reply came before its first batch:
        wait until that reply is applied; refuse a stale one (from before a loss)."""
        # that poll either comes back (applied) or fails (the replica is lost, which
        # moves _chan_from past it); the bound is a backstop below ACK_S. A poll of a
        # slow live replica can outlast it (up to _POLL_MAX_S): the refused replica has
        # taken nothing yet and goes back to being polled
        deadline = time.monotonic() + min(ACK_S / 2, 2 * _POLL_S)
        while True:
            if not 0 <= g < len(self._decode) or poll_no < self._chan_from.get(g, 0):
                return False
            if self._poll_applied.get(g, 0) >= poll_no:
                break
            ev = self._applied_ev.setdefault(g, asyncio.Event())
            ev.clear()
            try:
                await asyncio.wait_for(ev.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False
        self._chan_from[g] = poll_no
        self._chan_conn[g] = conn
        return True

    def _chan_events(self, g: int, conn: object, events: list[Any]) -> None:
        if self._chan_conn.get(g) is conn:  # else a connection of a lost replica
            self._route(g, events)

    def _chan_closed(self, g: int, conn: object) -> None:
        if self._chan_conn.get(g) is conn:
            del self._chan_conn[g]
            self._chan_broken.add(g)  # frames may be lost: the poll loop ends it

    # -- decode replicas ----------------------------------------------------------
    async def _poll_loop(self, g: int) -> None:
        while True:
            handle = self._decode[g]
            spec = self._channel_spec
            k = self._poll_sent[g] = self._poll_sent.get(g, 0) + 1
            try:
                call = (handle.poll.remote(self.owner, 1.0) if spec is None
                        else handle.poll.remote(self.owner, 1.0, spec, k))
                events = await reply(call, handle, self._actor_state,
                                     f"decode replica {g}", "poll", _POLL_S, _POLL_MAX_S,
                                     who="ingress")
            except (*GONE, *TIMEOUT) as exc:
                if self._decode[g] is not handle:
                    continue  # a replica of the actors lost before: its successor is polled
                log.warning("ingress: lost decode replica %d: %s", g, exc)
                if not await self._lost(g, handle):
                    return
                continue
            except BUG:
                log.exception("ingress: poll of replica %d raised", g)
                await asyncio.sleep(1.0)
                continue
            self._route(g, events)
            self._poll_applied[g] = k
            ev = self._applied_ev.get(g)
            if ev is not None:
                ev.set()
            if g in self._chan_broken:
                log.warning("ingress: event channel of decode replica %d broke", g)
                if not await self._lost(g, handle):
                    return

    def _route(self, g: int, events: list[Any]) -> None:
        for ev in events:
            rid = ev[0] if type(ev) is tuple else ev.request_id  # tokens are tuples
            q = self._queues.get(rid)
            if q is not None:
                q.put(ev)
            elif isinstance(ev, Admitted):
                # nobody waits for it any more (client gone): free the slot
                self._decode[g].abort.remote(rid)

    async def _lost(self, g: int, handle: Any) -> bool:
        """Replica ``g`` is gone: end its streams' attempts, replace it. False when
        there is nothing to replace it with (then its poll loop ends). When all the
        actors went with it (the owner does not answer, or answers with new ones), wait
        until new ones are adopted instead."""
        epoch = self._epoch
        if await self._actors_lost():  # all of them: the streams ended; no re-prefill
            await self._actors_up.wait()
            return True
        self._dead.add(g)
        # nothing more from its channel: a later hello must come from a newer poll
        self._chan_conn.pop(g, None)
        self._chan_broken.discard(g)
        self._chan_from[g] = self._poll_sent.get(g, 0) + 1
        ev = self._applied_ev.get(g)
        if ev is not None:  # a hello waiting for this replica's poll: refuse it now
            ev.set()
        for rid, where in list(self._placement.items()):
            if where == g and rid in self._queues:
                self._queues[rid].put(_Lost(g))
        self._scheduler.replica_lost.remote(g)
        if self._replace is None:
            return False
        while True:
            try:
                new, new_epoch = await self._replace(g, handle)
            except Exception as exc:  # no replacement came up, or the owner died
                log.error("ingress: replacing decode replica %d: %s; retrying", g, exc)
                new_epoch = None
            if new_epoch == epoch:
                break
            if await self._actors_lost() or self._epoch != epoch:
                await self._actors_up.wait()
                return True  # the new actors' handles are adopted
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
            except GONE:
                await self._actors_lost()
                continue
            except TIMEOUT:
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
            if self._actors_down:
                raise GenerateError(503, ACTORS_LOST, "service_unavailable")
            epoch = self._epoch
            try:
                return await getattr(self._scheduler, method).remote(*args)
            except SchedulerUnavailable as exc:  # raised inside it: a RayTaskError too
                raise GenerateError(503, f"scheduler unavailable: {exc}",
                                    "service_unavailable") from exc
            except GONE as exc:
                if await self._actors_lost() or self._epoch != epoch:
                    raise GenerateError(503, ACTORS_LOST, "service_unavailable") from exc
                if time.monotonic() > deadline:
                    raise GenerateError(503, f"scheduler unavailable: {exc}",
                                        "service_unavailable") from exc
                await asyncio.sleep(0.2)
            except BUG as exc:
                log.exception("ingress: scheduler.%s raised", method)
                raise GenerateError(500, f"scheduler error: {exc}", "server_error") from exc
