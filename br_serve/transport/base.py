"""The KV transport interface: move a prefilled request's KV from prefill to decode.

``put`` runs in the prefill worker, ``get`` (or ``get_async`` on an event loop) in the
decode replica that the scheduler chose (late binding: only after assignment),
``release`` when nobody needs the source copy any more. A handle is plain data and
travels through Ray calls. Who calls ``release``, and when, is the business of
:class:`br_serve.transport.lease.KVLease` and the keeper
(:mod:`br_serve.transport.keeper`), the same for every transport.
Errors: :class:`TransportError` with the transport's own return code in the message;
a transport never returns partial data silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class TransportError(RuntimeError):
    """A KV transfer failed (the message names the transport, key and code)."""


@dataclass(frozen=True, slots=True)
class KVHandle:
    """Where a request's KV lives. ``ref`` is transport-specific (e.g. a Ray ObjectRef).

    ``freed_by_consumer``: once a decode took the KV, its engine frees the source copy
    itself (a remote engine's KV connector), so the keeper then only forgets the
    handle; otherwise the keeper frees it through the transport.
    """

    transport: str
    key: str
    nbytes: int
    ref: Any = None
    freed_by_consumer: bool = False


class KVTransport(Protocol):
    """Moves one KV payload per key. ``release`` frees the source copy (a no-op where
    the data lives by reference, as in Ray's object store) and is idempotent."""

    name: str

    def put(self, key: str, kv: Any) -> KVHandle: ...

    def get(self, handle: KVHandle) -> Any: ...

    async def get_async(self, handle: KVHandle) -> Any:
        """``get`` for an event loop (without blocking it)."""
        ...

    def release(self, handle: KVHandle) -> None: ...

    def close(self) -> None: ...
