"""The KV keeper: holds every prefilled KV until it is released, then frees its source.

Why it exists: with the object-ref transport the prefill deployment's reply travels
through Serve's response path, which does not register the ingress as a borrower of an
``ObjectRef`` nested in it, so the object would be freed as soon as the prefill call
returns. With Mooncake a key lives in the prefill worker's segment until someone
removes it (a full segment fails every put). One rule covers both: the prefill worker
hands each handle to this actor (``hold``; a normal actor call, so Ray's borrowing
applies to a nested ref), and whoever is done with the KV (the decode replica after its
pull, the ingress when it gives a request up) calls ``release``; the keeper then frees
the source copy through its own transport (objref: drops the ref; Mooncake: removes the
key). A TTL bounds what a lost release can leak; expired entries are freed the same way.

Holds may come late. The ingress calls a remote engine itself and sends the holds
of its tickets in the background, batched (``hold_many``), so a decode replica's release of a
ticket it took can reach the keeper before the ticket's hold. A release of a key the
keeper does not hold is therefore remembered (for the TTL): a hold that comes after it
is dropped if a decode took the KV, and frees the source at once if the release gave the
request up.

Faults: a keeper that dies loses its handles (objects whose only holder it was are
freed, and their pulls fail with a retryable error: the ingress re-prefills). Its actor
restarts empty; Mooncake keys it held stay until their writer closes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from br_serve.transport.base import KVHandle, KVTransport, TransportError

log = logging.getLogger(__name__)

KEEPER_TTL_S = 600.0
#: most released-but-never-held keys remembered (a bound on memory, not a TTL)
_GONE_MAX = 100_000


def keeper_name(app_name: str) -> str:
    return f"{app_name}:kv"


class KVKeeper:
    """``hold(handle)`` / ``release(handle)`` / ``size()``; see the module docstring.

    ``transport`` and ``mooncake_master`` name the transport it frees through (built on
    first use, as a client that contributes no memory of its own).
    """

    def __init__(self, transport: str = "objref", mooncake_master: str | None = None,
                 ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 api_key: str | None = None) -> None:
        self.ttl_s = KEEPER_TTL_S if ttl_s is None else ttl_s
        self._api_key = api_key
        #: handles freed through the transport, and handles handed to their consumer
        self.freed = 0
        self.handed_over = 0
        self._transport_name = transport
        self._master = mooncake_master
        self._transport: KVTransport | None = None
        self._clock = clock
        self._held: collections.OrderedDict[str, tuple[float, KVHandle]] = (
            collections.OrderedDict())
        #: keys released while not held (time, consumed): a late hold of one is void
        self._gone: collections.OrderedDict[str, tuple[float, bool]] = (
            collections.OrderedDict())
        #: holds that came after their key's release
        self.late = 0

    async def hold(self, handle: KVHandle) -> None:
        now = self._clock()
        gone = self._gone.pop(handle.key, None)
        if gone is not None:  # released before this hold came (see the module docstring)
            self.late += 1
            consumed = gone[1]
            if consumed:
                self.handed_over += 1
            elif handle.freed_by_consumer:  # that release could not free it: free it now
                await self._free(handle)
            return  # (not consumed and not freed_by_consumer: that release freed it)
        self._held[handle.key] = (now, handle)
        self._held.move_to_end(handle.key)
        while self._held:
            key, (t, old) = next(iter(self._held.items()))
            if now - t <= self.ttl_s:
                break
            del self._held[key]
            log.warning("kv keeper: %r expired after %.0f s unreleased", key, self.ttl_s)
            await self._free(old)

    async def hold_many(self, handles: list[KVHandle]) -> None:
        """:meth:`hold` for each of ``handles`` (one call for a burst of tickets)."""
        for handle in handles:
            await self.hold(handle)

    async def release(self, handle: KVHandle, consumed: bool = False) -> None:
        """Drop ``handle`` and free its source copy (idempotent). ``consumed``: a decode
        took it; a handle ``freed_by_consumer`` is then only forgotten (its engine
        frees the source), and one no longer held is not freed again."""
        held = self._held.pop(handle.key, None) is not None
        if not held:
            self._remember(handle.key, consumed)
        if consumed and handle.freed_by_consumer:
            self.handed_over += held
            return
        if not held and handle.freed_by_consumer:
            return  # released before (or expired): its engine hold is gone already
        await self._free(handle)

    def _remember(self, key: str, consumed: bool) -> None:
        now = self._clock()
        self._gone[key] = (now, consumed or self._gone.get(key, (0.0, False))[1])
        self._gone.move_to_end(key)
        while self._gone:
            t, _ = next(iter(self._gone.values()))
            if now - t <= self.ttl_s and len(self._gone) <= _GONE_MAX:
                break
            self._gone.popitem(last=False)

    async def size(self) -> int:
        return len(self._held)

    async def counts(self) -> dict[str, int]:
        """``held``, ``freed`` (through the transport), ``handed_over`` and ``late`` (holds
        that came after their release) so far."""
        return {"held": len(self._held), "freed": self.freed,
                "handed_over": self.handed_over, "late": self.late}

    async def _free(self, handle: KVHandle) -> None:
        try:
            if self._transport is None:
                from br_serve.transport.factory import make_transport

                self._transport = make_transport(self._transport_name, self._master,
                                                 segment_bytes=0, api_key=self._api_key)
            await asyncio.to_thread(self._transport.release, handle)
            self.freed += 1
        except TransportError as exc:  # the request is unaffected; the writer's close frees it
            log.warning("kv keeper: freeing %r failed: %s", handle.key, exc)


def get_keeper(app_name: str, namespace: str, wait_s: float = 60.0) -> Any:
    """Look the keeper up by name, waiting for its asynchronous registration.

    Raises:
        ValueError: not registered within ``wait_s``.
    """
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get_actor(keeper_name(app_name), namespace=namespace)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
