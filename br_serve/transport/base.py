"""The KV transport interface: move a prefilled request's KV from prefill to decode.

``put`` runs in the prefill worker, ``get`` in the decode replica that the scheduler
chose (late binding: only after assignment), ``release`` when the decode side no
longer needs the source copy. A handle is plain data and travels through Ray calls.
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
    """Where a request's KV lives. ``ref`` is transport-specific (e.g. a Ray ObjectRef)."""

    transport: str
    key: str
    nbytes: int
    ref: Any = None


class KVTransport(Protocol):
    name: str

    def put(self, key: str, kv: Any) -> KVHandle: ...

    def get(self, handle: KVHandle) -> Any: ...

    def release(self, handle: KVHandle) -> None: ...

    def close(self) -> None: ...
