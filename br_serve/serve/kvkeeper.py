"""Keeps prefilled KV objects alive until a decode replica has pulled them.

Why: the prefill deployment's reply travels through Serve's response path, which does
not register the ingress as a borrower of an ``ObjectRef`` nested in it, so the object
would be freed as soon as the prefill call returns. The prefill worker therefore hands
each ref to this actor (a normal actor call, so Ray's borrowing protocol applies), and
the decode replica that pulled the KV, or the ingress that gave up on the request,
releases it. A TTL bounds what a lost release can leak.
"""

from __future__ import annotations

import time
from typing import Any

KEEPER_TTL_S = 600.0


def keeper_name(app_name: str) -> str:
    return f"{app_name}:kv"


class KVKeeper:
    """``hold(key, [ref])`` / ``release(key)``; entries expire after ``ttl_s``."""

    def __init__(self, ttl_s: float = KEEPER_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._held: dict[str, tuple[float, list[Any]]] = {}

    async def hold(self, key: str, refs: list[Any]) -> None:
        now = time.monotonic()
        self._held[key] = (now, refs)
        if len(self._held) % 256 == 0:
            for k in [k for k, (t, _) in self._held.items() if now - t > self.ttl_s]:
                del self._held[k]

    async def release(self, key: str) -> None:
        self._held.pop(key, None)

    async def size(self) -> int:
        return len(self._held)


def get_keeper(app_name: str, namespace: str, wait_s: float = 60.0) -> Any:
    """Look the keeper up by name, waiting for its asynchronous registration."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get_actor(keeper_name(app_name), namespace=namespace)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
