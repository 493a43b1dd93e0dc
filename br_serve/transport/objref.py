"""KV transport through Ray's object store (the default).

``put`` stores the payload with ``ray.put`` in the prefill worker and returns a handle
holding the ``ObjectRef``; ``get`` fetches it in the decode replica (numpy arrays and,
with ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1``, torch tensors are zero-copy there).
The object lives while a reference to it exists: ``release`` drops the handle's
reference on the decode side; the prefill side drops its own when the call returns.
"""

from __future__ import annotations

from typing import Any

from br_serve.transport.base import KVHandle, TransportError


def payload_nbytes(kv: Any) -> int:
    """Best-effort size in bytes of a KV payload (bytes, arrays, tensors, dicts of them)."""
    if isinstance(kv, bytes | bytearray | memoryview):
        return len(kv)
    if isinstance(kv, dict):
        return sum(payload_nbytes(v) for v in kv.values())
    if isinstance(kv, list | tuple):
        return sum(payload_nbytes(v) for v in kv)
    nbytes = getattr(kv, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    numel = getattr(kv, "numel", None)
    size = getattr(kv, "element_size", None)
    if callable(numel) and callable(size):
        return int(numel()) * int(size())
    return 0


class ObjectRefTransport:
    """KV through Ray object refs. Needs a running Ray (inside actors or after ray.init)."""

    name = "objref"

    def put(self, key: str, kv: Any) -> KVHandle:
        import ray

        try:
            ref = ray.put(kv)
        except ray.exceptions.RayError as exc:  # e.g. object store full
            raise TransportError(f"objref: put {key!r} failed: {exc}") from exc
        return KVHandle(transport=self.name, key=key, nbytes=payload_nbytes(kv), ref=ref)

    def get(self, handle: KVHandle) -> Any:
        import ray

        if handle.transport != self.name or handle.ref is None:
            raise TransportError(f"objref: handle {handle.key!r} is not an object-ref handle")
        try:
            return ray.get(handle.ref)
        except ray.exceptions.RayError as exc:  # owner died, object lost, ...
            raise TransportError(f"objref: get {handle.key!r} failed: {exc}") from exc

    async def get_async(self, handle: KVHandle) -> Any:
        """Awaits the ref on the caller's loop (no thread hop)."""
        from ray.exceptions import RayError

        if handle.transport != self.name or handle.ref is None:
            raise TransportError(f"objref: handle {handle.key!r} is not an object-ref handle")
        try:
            return await handle.ref
        except RayError as exc:  # owner died, object lost, ...
            raise TransportError(f"objref: get {handle.key!r} failed: {exc}") from exc

    def release(self, handle: KVHandle) -> None:
        # Dropping our reference is all Ray needs; the handle itself is frozen, so the
        # caller drops it too. Nothing to free explicitly.
        return None

    def close(self) -> None:
        return None
