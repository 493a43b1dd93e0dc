"""One process's side of a prefilled KV's lifetime, the same for every transport.

Every actor of the graph goes through a :class:`KVLease`; none looks at which transport
moves the KV:

- the prefill worker: ``put(key, kv)`` (in its worker thread) then ``await hold(handle)``
  before it replies: the keeper (:mod:`br_serve.transport.keeper`) keeps the KV alive
  until it is released;
- the decode replica: ``await pull(handle)``, then ``release(handle, consumed=True)``
  when its engine took the KV (a remote engine's connector then frees the source
  itself), or ``release(handle)`` after a failed pull (nobody will pull that key
  again: the ingress re-prefills under a new id);
- the ingress, when it gives up a request no replica pulled: ``release(handle)``;
- the ingress that prefilled on a remote engine itself: ``hold_soon(handle)``, which
  does not wait: the handles of one event-loop turn go to the keeper in one
  ``hold_many`` call, sent before any later ``release`` from this process (a release
  from another process may still come first: the keeper remembers it).

``release`` is fire-and-forget and never raises: a lost release is bounded by the
keeper's TTL. Each holder releases a handle once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import Any

from br_serve.transport.base import KVHandle, KVTransport, TransportError

log = logging.getLogger(__name__)


class KVLease:
    """``transport``: this process's own (None where it never moves KV: the ingress).
    ``keeper``: the keeper actor handle, or ``find_keeper``: a function that finds it
    (called on first use).

    Raises:
        ValueError: neither or both of ``keeper`` and ``find_keeper``.
    """

    def __init__(self, transport: KVTransport | None, keeper: Any = None,
                 find_keeper: Callable[[], Any] | None = None) -> None:
        if (keeper is None) == (find_keeper is None):
            raise ValueError("kv lease: give exactly one of keeper, find_keeper")
        self._transport = transport
        self._keeper: Any = keeper
        self._find_keeper = find_keeper
        self._tasks: set[asyncio.Task[None]] = set()
        self._soon: list[KVHandle] = []
        #: holds ``hold_soon`` could not register (the keeper was unreachable)
        self.holds_lost = 0

    def _keeper_handle(self) -> Any:
        if self._keeper is None:
            assert self._find_keeper is not None
            self._keeper = self._find_keeper()
        return self._keeper

    def _own(self) -> KVTransport:
        if self._transport is None:
            raise TransportError("kv lease: this process has no transport")
        return self._transport

    def put(self, key: str, kv: Any) -> KVHandle:
        """Store ``kv`` under ``key`` (blocking; run it off the event loop)."""
        return self._own().put(key, kv)

    async def hold(self, handle: KVHandle) -> None:
        """Register ``handle`` with the keeper (before the put's caller replies).

        Raises:
            TransportError: the keeper is unreachable.
        """
        from ray.exceptions import RayActorError

        for attempt in (1, 2):
            try:
                keeper = (self._keeper if self._keeper is not None
                          else await asyncio.to_thread(self._keeper_handle))  # lookup waits
                await keeper.hold.remote(handle)
                return
            except (RayActorError, ValueError) as exc:  # ValueError: not registered
                if not self._forget_keeper() or attempt == 2:
                    raise TransportError(f"kv lease: keeper unreachable for "
                                         f"{handle.key!r}: {exc}") from exc

    def hold_soon(self, handle: KVHandle) -> None:
        """:meth:`hold` off the caller's path: queued, and sent with the others queued in
        this event-loop turn as one ``hold_many`` call. A keeper that cannot be reached
        is logged and counted (``holds_lost``); the request goes on, without the
        keeper's TTL behind it (its engine's own timeout still bounds it)."""
        self._soon.append(handle)
        if len(self._soon) == 1:
            loop = asyncio.get_running_loop()
            contextvars.Context().run(loop.call_soon, self._flush_holds)

    def _flush_holds(self) -> None:
        if not self._soon:
            return
        batch, self._soon = self._soon, []
        try:
            ref = self._keeper_handle().hold_many.remote(batch)
        except ValueError as exc:  # keeper not registered
            self._holds_failed(batch, exc)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a thread): sent, not watched
            return
        task = contextvars.Context().run(loop.create_task, self._await_holds(ref, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _await_holds(self, ref: Any, batch: list[KVHandle]) -> None:
        from ray.exceptions import RayError

        try:
            await ref
        except RayError as exc:
            self._holds_failed(batch, exc)

    def _holds_failed(self, batch: list[KVHandle], exc: Exception) -> None:
        self.holds_lost += len(batch)
        log.warning("kv lease: keeper unreachable; %d holds lost (%s...): %s", len(batch),
                    batch[0].key, exc)
        self._forget_keeper()

    def _forget_keeper(self) -> bool:
        """After a failed call: look the keeper up again next time (a new graph may run
        a new keeper under the same name). False if there is nothing to look up."""
        if self._find_keeper is None:
            return False
        self._keeper = None
        return True

    def discard(self, handle: KVHandle) -> None:
        """Free the source copy here, through this process's transport (blocking; for a
        put whose ``hold`` failed, so that no keeper will ever free it)."""
        self._own().release(handle)

    async def pull(self, handle: KVHandle) -> Any:
        """The KV payload. Raises :class:`TransportError` if it is gone."""
        return await self._own().get_async(handle)

    def release(self, handle: KVHandle, consumed: bool = False) -> None:
        """Nobody here needs ``handle`` any more (see the module docstring);
        ``consumed``: a decode took its KV."""
        self._flush_holds()  # a queued hold is sent first (the keeper copes with either order)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a thread): send and forget
            self._send_release(handle, consumed)
            return
        # in an empty context: called while a request is being cancelled (its client
        # left), the keeper call would be that request's child task, which Ray cancels
        # with it (see br_serve.serve.frontend.streams._detached)
        task = contextvars.Context().run(loop.create_task, self._release(handle, consumed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_release(self, handle: KVHandle, consumed: bool = False) -> Any:
        try:
            if consumed and handle.freed_by_consumer:  # the keeper only forgets it
                return self._keeper_handle().release.remote(handle, True)
            return self._keeper_handle().release.remote(handle)
        except ValueError as exc:  # keeper not registered: its TTL cannot help either
            log.warning("kv lease: no keeper to release %r: %s", handle.key, exc)
            return None

    async def _release(self, handle: KVHandle, consumed: bool = False) -> None:
        from ray.exceptions import RayError

        ref = self._send_release(handle, consumed)
        if ref is None:
            return
        try:
            await ref
        except RayError as exc:  # keeper restarting: the restarted one holds nothing
            log.warning("kv lease: release of %r failed: %s", handle.key, exc)
            self._forget_keeper()
