"""The ``remote`` transport: the KV stays on a remote prefill engine; a ticket moves.

``put(key, ticket)`` returns a :class:`KVHandle` carrying the
:class:`~br_serve.remote.ticket.RemoteTicket` inline (a few hundred bytes travel with
the pool entry; nothing is stored); ``get`` returns it. ``release`` is what frees the
prefill's hold on the engine when no decode will ever pull it (the keeper calls it for
a released handle, or one that outlived its TTL, the graph's ``pool_ttl_s``): vLLM
``POST /v1/requests/{id}/cancel``, SGLang ``POST /abort_request``. A decode that took
the ticket hands the hold over to the engine's own connector instead
(``KVHandle.freed_by_consumer``), so a successful decode is never cancelled.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from br_serve.remote.requests import KEEPALIVE_S, bearer
from br_serve.remote.ticket import RemoteTicket
from br_serve.transport.base import KVHandle, TransportError

log = logging.getLogger(__name__)


class RemoteTicketTransport:
    """See the module docstring. ``api_key``: the engines' bearer key; ``keepalive_s``:
    how long an idle connection is reused, below the engines' server keep-alive (see
    :class:`~br_serve.remote.client.Timeouts`)."""

    name = "remote"

    def __init__(self, api_key: str | None = None, timeout_s: float = 5.0,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self._headers = bearer(api_key)
        self._timeout_s = timeout_s
        self._limits = httpx.Limits(keepalive_expiry=keepalive_s)
        self._http: httpx.Client | None = None
        #: prefill holds this process freed on the engine (for tests and logs)
        self.released = 0

    def put(self, key: str, kv: Any) -> KVHandle:
        if not isinstance(kv, RemoteTicket):
            raise TransportError(f"remote: {key!r}: expected a RemoteTicket, got "
                                 f"{type(kv).__name__}")
        return KVHandle(transport=self.name, key=key, nbytes=0, ref=kv,
                        freed_by_consumer=True)

    def get(self, handle: KVHandle) -> Any:
        if handle.transport != self.name or not isinstance(handle.ref, RemoteTicket):
            raise TransportError(f"remote: handle {handle.key!r} is not a remote ticket")
        return handle.ref

    async def get_async(self, handle: KVHandle) -> Any:
        return self.get(handle)

    def release(self, handle: KVHandle) -> None:
        """Free the prefill's hold on the engine (blocking; an engine that no longer
        knows the request, 404, is fine: it was pulled, aborted or expired there)."""
        ticket = handle.ref
        if not isinstance(ticket, RemoteTicket):
            return
        if ticket.prompt_keyed:  # a prompt-keyed connector holds no request to free
            self.released += 1
            return
        url, body = ticket.release_call()
        if self._http is None:
            self._http = httpx.Client(headers=self._headers, timeout=self._timeout_s,
                                      limits=self._limits)
        try:
            r = self._http.post(url, json=body)
        except httpx.HTTPError as exc:
            raise TransportError(f"remote: release of {handle.key!r} at {url} failed: "
                                 f"{type(exc).__name__}: {exc}") from None
        if r.status_code not in (200, 404):
            raise TransportError(f"remote: release of {handle.key!r} at {url}: HTTP "
                                 f"{r.status_code} {r.text[:200]}")
        self.released += 1

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
