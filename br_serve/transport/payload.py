"""KV payload packing: one self-describing contiguous byte buffer per request.

Payloads the engines produce, and that every transport must move unchanged:
- the torch engine: ``{"keys": Tensor, "values": Tensor}``, CPU tensors of shape
  ``[layers, kv_heads, prompt_tokens, head_dim]`` in the model's dtype (bf16 included);
- the emulated engine: a ``uint8`` numpy array (opaque bytes);
- also accepted: ``bytes``, a numpy array, a torch tensor, or a dict of str -> array/tensor.

The Ray object-ref transport moves these objects as they are (tensors and arrays are
zero-copy in the object store). Byte transports (Mooncake) use :func:`pack_payload` /
:func:`unpack_payload`:

    b"BRKV0001" | u64 LE header length | JSON header | pad to 64 | blobs, each 64-aligned

The header lists, per entry: name, library (numpy / torch / bytes), dtype, shape, offset
and byte length. Unpacking checks the magic, the header and every extent, and raises
:class:`PayloadError` on any mismatch: a truncated buffer never yields partial data.
Unpacked arrays and tensors are views on the buffer (no copy). torch is imported only
when a tensor is packed or unpacked.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

MAGIC = b"BRKV0001"
_ALIGN = 64
_PREFIX = struct.Struct("<8sQ")


class PayloadError(ValueError):
    """A packed KV buffer is malformed or truncated."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "untyped_storage")


def _entry_bytes(name: str, value: Any) -> tuple[dict[str, Any], np.ndarray]:
    """Header entry and a flat uint8 view of one value (copies only if non-contiguous)."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = np.frombuffer(memoryview(value).cast("B"), dtype=np.uint8)
        return {"name": name, "lib": "bytes", "dtype": "uint8", "shape": [raw.size]}, raw
    if isinstance(value, np.ndarray):
        # (np.ascontiguousarray would turn a 0-d array into 1-d: keep value's shape)
        arr = value if value.flags.c_contiguous else np.ascontiguousarray(value)
        meta = {"name": name, "lib": "numpy", "dtype": arr.dtype.str,
                "shape": list(value.shape)}
        return meta, arr.reshape(-1).view(np.uint8)
    if _is_tensor(value):
        import torch

        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        meta = {"name": name, "lib": "torch", "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape)}
        return meta, t.reshape(-1).view(torch.uint8).numpy()
    raise TypeError(f"KV payload entry {name!r}: unsupported type {type(value).__name__}")


def pack_payload(kv: Any) -> np.ndarray:
    """Pack ``kv`` into one new contiguous ``uint8`` array (one copy of the data).

    Raises:
        TypeError: ``kv`` (or a dict value) is not bytes, an array or a tensor.
    """
    if isinstance(kv, dict):
        kind = "dict"
        items = list(kv.items())
        if not all(isinstance(k, str) for k, _ in items):
            raise TypeError("KV payload dict keys must be str")
    else:
        kind = "single"
        items = [("", kv)]
    entries: list[dict[str, Any]] = []
    blobs: list[np.ndarray] = []
    offset = 0
    for name, value in items:
        meta, raw = _entry_bytes(name, value)
        meta["offset"], meta["nbytes"] = offset, int(raw.size)
        entries.append(meta)
        blobs.append(raw)
        offset = _align(offset + raw.size)
    header = json.dumps({"kind": kind, "entries": entries}, separators=(",", ":")).encode()
    data_start = _align(_PREFIX.size + len(header))
    out = np.zeros(data_start + offset, dtype=np.uint8)
    out[: _PREFIX.size] = np.frombuffer(_PREFIX.pack(MAGIC, len(header)), dtype=np.uint8)
    out[_PREFIX.size : _PREFIX.size + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for meta, raw in zip(entries, blobs, strict=True):
        start = data_start + meta["offset"]
        out[start : start + raw.size] = raw
    return out


def _decode_entry(meta: dict[str, Any], raw: np.ndarray) -> Any:
    lib, dtype, shape = meta["lib"], meta["dtype"], tuple(meta["shape"])
    if lib == "bytes":
        return raw.tobytes()
    if lib == "numpy":
        return raw.view(np.dtype(dtype)).reshape(shape)
    if lib == "torch":
        import torch

        tdtype = getattr(torch, dtype, None)
        if not isinstance(tdtype, torch.dtype):
            raise PayloadError(f"unknown torch dtype {dtype!r}")
        if not raw.flags.writeable:  # torch tensors cannot wrap read-only memory safely
            raw = raw.copy()
        return torch.from_numpy(raw).view(tdtype).reshape(shape)
    raise PayloadError(f"unknown entry library {lib!r}")


def unpack_payload(buf: np.ndarray | bytes | memoryview) -> Any:
    """Inverse of :func:`pack_payload`; results are views on ``buf`` (keep it alive).

    Raises:
        PayloadError: bad magic, bad header, or an entry that runs past the buffer.
    """
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise PayloadError("packed KV must be a 1-D uint8 buffer")
    if arr.size < _PREFIX.size:
        raise PayloadError(f"packed KV truncated: {arr.size} bytes, no header")
    magic, hlen = _PREFIX.unpack(arr[: _PREFIX.size].tobytes())
    if magic != MAGIC:
        raise PayloadError(f"packed KV has bad magic {magic!r}")
    if _PREFIX.size + hlen > arr.size:
        raise PayloadError(f"packed KV truncated: header of {hlen} bytes does not fit")
    try:
        header = json.loads(arr[_PREFIX.size : _PREFIX.size + hlen].tobytes())
        kind, entries = header["kind"], header["entries"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PayloadError(f"packed KV header unreadable: {exc}") from exc
    data_start = _align(_PREFIX.size + hlen)
    out: dict[str, Any] = {}
    for meta in entries:
        start = data_start + int(meta["offset"])
        end = start + int(meta["nbytes"])
        if end > arr.size:
            raise PayloadError(f"packed KV truncated: entry {meta['name']!r} ends at {end}, "
                               f"buffer has {arr.size} bytes")
        out[meta["name"]] = _decode_entry(meta, arr[start:end])
    if kind == "single":
        if len(out) != 1:
            raise PayloadError("packed KV of kind 'single' must have exactly one entry")
        return out[""]
    if kind != "dict":
        raise PayloadError(f"packed KV has unknown kind {kind!r}")
    return out
