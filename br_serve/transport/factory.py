"""Pick a KV transport by name (the engine factory and the keeper build theirs here).

Mooncake is imported only for ``transport="mooncake"``.
"""

from __future__ import annotations

from br_serve.transport.base import KVTransport

#: Names :func:`make_transport` accepts.
TRANSPORT_NAMES = ("objref", "mooncake", "remote")


def make_transport(name: str, mooncake_master: str | None = None,
                   segment_bytes: int | None = None,
                   api_key: str | None = None) -> KVTransport:
    """``"objref"`` (Ray object store, default) or ``"mooncake"`` (master at
    ``mooncake_master``, else ``MOONCAKE_MASTER``, see
    :class:`br_serve.transport.mooncake.MooncakeTransport`). ``segment_bytes``: the
    memory a Mooncake client contributes to the store (default: the transport's own;
    0 for a client that only pulls and removes, such as the keeper). Both options are
    ignored for objref. ``"remote"``: tickets of a remote engine's transfer parameters
    (:mod:`br_serve.transport.remote`; ``api_key``: the engines' bearer key).

    Raises:
        ValueError: unknown transport name, malformed ``mooncake_master``.
        TransportError: Mooncake missing or its master unreachable.
    """
    if name == "objref":
        from br_serve.transport.objref import ObjectRefTransport

        return ObjectRefTransport()
    if name == "mooncake":
        from br_serve.transport.mooncake import MooncakeTransport

        if segment_bytes is None:
            return MooncakeTransport(master_address=mooncake_master)
        return MooncakeTransport(master_address=mooncake_master,
                                 global_segment_size=segment_bytes)
    if name == "remote":
        from br_serve.transport.remote import RemoteTicketTransport

        return RemoteTicketTransport(api_key=api_key)
    raise ValueError(f"transport: unknown {name!r}; known: {', '.join(TRANSPORT_NAMES)}")
