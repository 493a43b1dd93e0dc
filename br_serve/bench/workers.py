"""Minimal prefill / decode endpoints around an engine and a KV transport.

These are plain classes: wrap them with ``ray.remote`` to get a prefill actor and a
decode actor (the disaggregated-path tests and ``br-serve bench-kv`` do). They own
their transport, so its lifetime rule holds: a :class:`PrefillEndpoint` keeps every KV it
put available until the decode side releases it or the worker closes.

The serving graph (``br_serve.serve``) has its own actors; these exist to exercise the
engine + transport path end to end with nothing else in the way.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from br_serve.engine.base import PrefillResult, SamplingParams, TokenEvent
from br_serve.transport.base import KVHandle, KVTransport


def build_transport(name: str, options: dict[str, Any] | None = None) -> KVTransport:
    """``"objref"`` or ``"mooncake"`` (``options`` go to ``MooncakeTransport``).

    Raises:
        ValueError: unknown name, or options for the object-ref transport.
    """
    opts = dict(options or {})
    if name == "objref":
        if opts:
            raise ValueError(f"transport_options: objref takes none, got {sorted(opts)}")
        from br_serve.transport.objref import ObjectRefTransport

        return ObjectRefTransport()
    if name == "mooncake":
        from br_serve.transport.mooncake import MooncakeTransport

        return MooncakeTransport(**opts)
    raise ValueError(f"transport: unknown {name!r}; known: objref, mooncake")


def spawn(cls: type, *args: Any, **ray_options: Any) -> Any:
    """Start ``cls(*args)`` as a Ray actor with ``ray_options``; returns the handle."""
    import ray

    actor_cls: Any = ray.remote(**ray_options)(cls)
    return actor_cls.remote(*args)


def build_engine(kind: str, **kwargs: Any) -> Any:
    if kind == "torch":
        from br_serve.engine.torch_engine import TorchEngine

        return TorchEngine(**kwargs)
    raise ValueError(f"engine: unknown {kind!r}")


class PrefillEndpoint:
    """Prefill a prompt and put its KV through the transport."""

    def __init__(self, engine: dict[str, Any] | None, transport: str,
                 transport_options: dict[str, Any] | None = None) -> None:
        self.engine = build_engine(**engine) if engine else None
        self.transport = build_transport(transport, transport_options)

    def prefill(self, request_id: str, prompt: str | list[int],
                params: SamplingParams) -> tuple[PrefillResult, KVHandle]:
        """The result (``kv`` dropped: it travels by handle) and the KV handle."""
        assert self.engine is not None, "this worker has no engine"
        res = self.engine.prefill(request_id, prompt, params)
        handle = self.transport.put(f"kv/{request_id}", res.kv)
        return dataclasses.replace(res, kv=None), handle

    def put_payload(self, key: str, kv: Any) -> tuple[KVHandle, float]:
        """Put an arbitrary payload (benchmarks); returns the handle and seconds taken."""
        t0 = time.perf_counter()
        handle = self.transport.put(key, kv)
        return handle, time.perf_counter() - t0

    def close(self) -> None:
        self.transport.close()


class DecodeEndpoint:
    """Pull KV by handle, admit into the engine, step all admitted requests together."""

    def __init__(self, engine: dict[str, Any] | None, transport: str,
                 transport_options: dict[str, Any] | None = None) -> None:
        self.engine = build_engine(**engine) if engine else None
        self.transport = build_transport(transport, transport_options)

    def admit(self, result: PrefillResult, handle: KVHandle, params: SamplingParams) -> None:
        assert self.engine is not None, "this worker has no engine"
        kv = self.transport.get(handle)
        self.engine.admit(result.request_id, kv, result.prompt_tokens,
                          result.first_token_id, params)
        self.transport.release(handle)

    def step(self) -> list[TokenEvent]:
        assert self.engine is not None, "this worker has no engine"
        return list(self.engine.step())

    def running(self) -> int:
        return 0 if self.engine is None else int(self.engine.running())

    def pull_payload(self, handle: KVHandle) -> tuple[float, int]:
        """Get a payload (benchmarks): seconds taken and the payload's data bytes."""
        from br_serve.transport.objref import payload_nbytes

        t0 = time.perf_counter()
        kv = self.transport.get(handle)
        dt = time.perf_counter() - t0
        self.transport.release(handle)
        return dt, payload_nbytes(kv)

    def close(self) -> None:
        self.transport.close()
