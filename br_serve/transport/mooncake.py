"""KV transport through a Mooncake distributed store (TCP on CPU, RDMA/HCCS elsewhere).

Each process (prefill worker, decode replica) owns one :class:`MooncakeTransport`, i.e.
one ``MooncakeDistributedStore`` client that mounts ``global_segment_size`` bytes of its
own memory into the store. Handles are plain data (key + size) and travel through Ray.

Lifetime rule (explicit, because Mooncake does not keep data alive by reference):
- ``put`` writes the packed payload (:func:`br_serve.transport.payload.pack_payload`) into the
  *writer's own* segment (``preferred_segment`` = this client) with a hard pin, so the
  master never evicts a KV that no one has pulled yet; a full store fails the put with
  a return code instead.
- The key lives until someone calls ``release`` (the decode side, once it has pulled
  the KV; removal is forced because a read leaves a short lease on the key), or until
  the writer's transport closes: its segment is unmounted and the key vanishes. So a
  prefill worker must keep its transport open until decode has pulled.
- ``get`` of a vanished key raises :class:`TransportError` with code -704.

Every Mooncake call returns a code (0 or a byte count on success, negative on error);
every one is checked, and a failure raises ``TransportError`` naming the operation, key
and code. A master that is down is detected at start-up by a bounded TCP probe
(``connect_timeout_s``) before ``setup``, which would otherwise retry for ~90 s.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import numpy as np

from br_serve.transport.base import KVHandle, TransportError
from br_serve.transport.payload import PayloadError, pack_payload, unpack_payload

DEFAULT_MASTER = "127.0.0.1:50051"
MASTER_ENV = "MOONCAKE_MASTER"
HOSTNAME_ENV = "MOONCAKE_LOCAL_HOSTNAME"
PROTOCOL_ENV = "MOONCAKE_PROTOCOL"

# Names of the codes this transport meets most (mooncake-store/include/types.h).
ERROR_NAMES = {
    -1: "INTERNAL_ERROR", -10: "BUFFER_OVERFLOW", -101: "SEGMENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE (store full)", -400: "INVALID_KEY", -600: "INVALID_PARAMS",
    -601: "ILLEGAL_CLIENT", -700: "INVALID_WRITE", -701: "INVALID_READ",
    -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND", -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE", -707: "LEASE_EXPIRED", -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
}
OBJECT_NOT_FOUND = -704


def _code(rc: int) -> str:
    return f"code {rc} ({ERROR_NAMES.get(rc, 'see mooncake types.h')})"


def parse_address(address: str, field: str = "master_address") -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``.

    Raises:
        ValueError: not ``host:port`` with a port in 1..65535 (names ``field``).
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: expected host:port, got {address!r}")
    return host, int(port)


def default_local_hostname() -> str:
    """``MOONCAKE_LOCAL_HOSTNAME``, else this node's Ray IP (inside Ray), else loopback.

    Peers pull KV from the writer's segment at this address, so across hosts it must be
    an address they can reach; loopback only works on one host.
    """
    env = os.environ.get(HOSTNAME_ENV)
    if env:
        return env
    try:
        import ray

        if ray.is_initialized():
            node_ip: Any = ray.util.get_node_ip_address
            return str(node_ip())
    except ImportError:
        pass
    return "127.0.0.1"


def probe_master(address: str, timeout_s: float) -> None:
    """Raise :class:`TransportError` unless a TCP connection to ``address`` opens in time."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise TransportError(
            f"mooncake: master at {address} is not reachable ({exc}); start it with "
            f"`mooncake_master --rpc_port={port}` or set {MASTER_ENV}") from exc


class MooncakeTransport:
    """KV transport through a Mooncake store; one per process. ``put``/``get`` may run
    from several threads at once (tested); ``close`` only when no call is in flight.

    Args:
        master_address: ``host:port`` of ``mooncake_master``; default: the environment
            variable ``MOONCAKE_MASTER``, else ``127.0.0.1:50051``.
        local_hostname: the address peers use to reach this process; default:
            :func:`default_local_hostname`.
        metadata_server: ``"P2PHANDSHAKE"`` (no etcd/HTTP metadata service needed).
        protocol: ``"tcp"`` (CPU hosts; the tested one) or ``"rdma"`` where the wheel
            and NICs support it; default: ``MOONCAKE_PROTOCOL``, else ``"tcp"``.
        global_segment_size: bytes this process contributes to the store (must hold
            the KV it has put and not yet released).
        local_buffer_size: the client's transfer buffer.
        connect_timeout_s: bound on the master reachability probe.

    Raises:
        ValueError: malformed address or sizes.
        TransportError: package missing, master unreachable, or ``setup`` failed.
    """

    name = "mooncake"

    def __init__(self, master_address: str | None = None, local_hostname: str | None = None,
                 metadata_server: str = "P2PHANDSHAKE", protocol: str | None = None,
                 global_segment_size: int = 512 * 1024**2,
                 local_buffer_size: int = 64 * 1024**2, rdma_devices: str = "",
                 connect_timeout_s: float = 5.0) -> None:
        address = master_address or os.environ.get(MASTER_ENV) or DEFAULT_MASTER
        parse_address(address)
        local_hostname = local_hostname or default_local_hostname()
        protocol = protocol or os.environ.get(PROTOCOL_ENV) or "tcp"
        if global_segment_size < 0 or local_buffer_size < 0:
            raise ValueError("global_segment_size/local_buffer_size: must be >= 0")
        self.master_address = address
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        except ImportError as exc:
            raise TransportError(
                "mooncake: the mooncake package is not importable; install "
                "mooncake-transfer-engine-non-cuda (CPU, needs libibverbs1) or the "
                f"-npu wheel on Ascend ({exc})") from exc
        probe_master(address, connect_timeout_s)
        store = MooncakeDistributedStore()
        rc = store.setup(local_hostname, metadata_server, global_segment_size,
                         local_buffer_size, protocol, rdma_devices, address)
        if rc != 0:
            raise TransportError(f"mooncake: setup with master {address} failed: {_code(rc)}")
        self._store: Any = store
        self._put_config = ReplicateConfig()
        self._put_config.preferred_segment = store.get_hostname()  # our own segment
        self._put_config.with_hard_pin = True  # never evicted before release
        self._closed = False

    def _live(self) -> Any:
        if self._closed:
            raise TransportError("mooncake: transport is closed")
        return self._store

    def _with_registered(self, buf: np.ndarray, op: str, key: str) -> None:
        rc = self._store.register_buffer(buf.ctypes.data, buf.nbytes)
        if rc != 0:
            raise TransportError(f"mooncake: register_buffer for {op} {key!r} failed: "
                                 f"{_code(rc)}")

    def _unregister(self, buf: np.ndarray, op: str, key: str) -> None:
        rc = self._store.unregister_buffer(buf.ctypes.data)
        if rc != 0:
            raise TransportError(f"mooncake: unregister_buffer after {op} {key!r} failed: "
                                 f"{_code(rc)}")

    def put(self, key: str, kv: Any) -> KVHandle:
        """Pack ``kv`` and store it under ``key`` in this process's segment."""
        store = self._live()
        buf = pack_payload(kv)
        self._with_registered(buf, "put", key)
        try:
            rc = store.put_from(key, buf.ctypes.data, buf.nbytes, self._put_config)
        finally:
            self._unregister(buf, "put", key)
        if rc != 0:
            raise TransportError(f"mooncake: put {key!r} ({buf.nbytes} bytes) failed: "
                                 f"{_code(rc)}")
        return KVHandle(transport=self.name, key=key, nbytes=int(buf.nbytes))

    def get(self, handle: KVHandle) -> Any:
        """Pull and unpack the payload; checks the size against the handle's."""
        store = self._live()
        if handle.transport != self.name:
            raise TransportError(f"mooncake: handle {handle.key!r} is a {handle.transport!r} "
                                 "handle")
        size = int(store.get_size(handle.key))
        if size < 0:
            raise TransportError(f"mooncake: get {handle.key!r} failed: {_code(size)} (the "
                                 "writer closed or released it, or it was never put)")
        if size != handle.nbytes:
            raise TransportError(f"mooncake: get {handle.key!r}: store holds {size} bytes, "
                                 f"handle says {handle.nbytes}")
        buf = np.empty(size, dtype=np.uint8)
        self._with_registered(buf, "get", handle.key)
        try:
            got = int(store.get_into(handle.key, buf.ctypes.data, size))
        finally:
            self._unregister(buf, "get", handle.key)
        if got != size:
            raise TransportError(f"mooncake: get {handle.key!r} returned {got} of {size} "
                                 f"bytes" + (f": {_code(got)}" if got < 0 else ""))
        try:
            return unpack_payload(buf)
        except PayloadError as exc:
            raise TransportError(f"mooncake: get {handle.key!r}: corrupt payload: "
                                 f"{exc}") from exc

    async def get_async(self, handle: KVHandle) -> Any:
        """``get`` in a worker thread (Mooncake's calls block)."""
        return await asyncio.to_thread(self.get, handle)

    def exists(self, key: str) -> bool:
        rc = int(self._live().is_exist(key))
        if rc < 0:
            raise TransportError(f"mooncake: is_exist {key!r} failed: {_code(rc)}")
        return rc == 1

    def release(self, handle: KVHandle) -> None:
        """Remove the key (forced past the read lease); an already vanished key is fine."""
        rc = int(self._live().remove(handle.key, True))
        if rc not in (0, OBJECT_NOT_FOUND):
            raise TransportError(f"mooncake: remove {handle.key!r} failed: {_code(rc)}")

    def close(self) -> None:
        """Close the client: keys put here and not yet released vanish. Idempotent."""
        if self._closed:
            return
        self._closed = True
        rc = int(self._store.close())
        if rc != 0:
            raise TransportError(f"mooncake: close failed: {_code(rc)}")

    def __enter__(self) -> MooncakeTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
