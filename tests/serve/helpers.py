"""Shared helpers of the serve tests: a local cluster, SSE parsing, checks, and the fake
KV transport and keeper the Ray-free decode replica tests use."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from br_serve.engine.emulated import token_id, token_text
from br_serve.transport.base import KVHandle, TransportError


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_PORTS = random.Random()  # a test helper's own generator: ports only


def free_port() -> int:
    """A port that is free now and that nobody else is handed later.

    The tests pick a port, then a server binds it (Serve's proxy, Ray's metrics agent).
    A port from ``bind(0)`` lies in the kernel's ephemeral range, which the kernel hands
    to every other ``bind(0)`` and outgoing connection meanwhile: a Ray session starting
    while the previous one shut down took the metrics port a module had picked (CI: the
    agent failed with EADDRINUSE, the node never started). Ports between 20000 and the
    ephemeral range (Ray's workers use 10002-19999) are only ever bound on purpose.
    """
    lo = 20000
    hi = min(_ephemeral_range()[0], 65536) - 1
    for _ in range(200):
        port = _PORTS.randint(lo, hi) if hi > lo else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError(f"no free port in [{lo}, {hi}]")


def start_ray(metrics_port: int | None = None) -> None:
    """A local cluster for one test module; ``metrics_port``: Prometheus export port."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    ray.init(include_dashboard=False, num_cpus=2, object_store_memory=200 * 1024**2,
             log_to_driver=False, _metrics_export_port=metrics_port)


@dataclass
class StreamResult:
    status: int
    texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    error: str | None = None
    done: bool = False
    body: Any = None
    id: str | None = None


async def stream_completion(client: httpx.AsyncClient, path: str, payload: dict[str, Any],
                            headers: dict[str, str] | None = None) -> StreamResult:
    """POST with ``stream: true`` and parse the SSE events."""
    async with client.stream("POST", path, json={**payload, "stream": True},
                             headers=headers) as r:
        res = StreamResult(r.status_code)
        if r.status_code != 200:
            res.body = json.loads(await r.aread())
            return res
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                res.done = True
                break
            ev = json.loads(data)
            res.id = ev.get("id", res.id)
            if "error" in ev:
                res.error = ev["error"]["message"]
                continue
            if ev.get("usage"):
                res.usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("text") if "text" in ch else ch["delta"].get("content")
                if piece:
                    res.texts.append(piece)
                if ch.get("finish_reason"):
                    res.finish_reason = ch["finish_reason"]
    return res


def expected_texts(seed: int, prompt_tokens: int, n: int) -> list[str]:
    """The emulated engine's tokens for a request with ``seed`` and this prompt length."""
    return [token_text(token_id(seed, prompt_tokens + i)) for i in range(n)]


class RecordingTransport:
    """Serves payloads by key; records every release; ``get`` of a ``bad`` key fails."""

    name = "fake"

    def __init__(self, bad: frozenset[str] = frozenset()) -> None:
        self.bad = bad
        self.gets: list[str] = []
        self.releases: list[str] = []
        self._lock = threading.Lock()

    def put(self, key: str, kv: Any) -> KVHandle:
        raise AssertionError("decode never puts")

    def get(self, handle: KVHandle) -> Any:
        with self._lock:
            self.gets.append(handle.key)
        if handle.key in self.bad:
            raise TransportError(f"fake: get {handle.key!r} failed: code -800")
        return bytes(handle.nbytes)  # what the emulated engine admits: nbytes of KV

    async def get_async(self, handle: KVHandle) -> Any:
        return self.get(handle)

    def release(self, handle: KVHandle) -> None:
        with self._lock:
            self.releases.append(handle.key)

    def close(self) -> None:
        return None


class _Method:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def remote(self, handle: KVHandle) -> None:
        self.calls.append(handle.key)


class FakeKeeper:
    """Stands in for the KVKeeper actor handle (``keeper.release.remote(handle)``);
    records the keys."""

    def __init__(self) -> None:
        self.released: list[str] = []
        self.held: list[str] = []
        self.release = _Method(self.released)
        self.hold = _Method(self.held)


def fake_lease(transport: Any = None) -> tuple[Any, FakeKeeper]:
    """A :class:`KVLease` over ``transport`` and a :class:`FakeKeeper`."""
    from br_serve.transport.lease import KVLease

    keeper = FakeKeeper()
    return KVLease(transport, keeper=keeper), keeper
