"""The graph behind Serve's HAProxy front door (``serve.front=haproxy``), over real HTTP.

One local Ray cluster started as ``br-serve`` starts it for ``serve.front=haproxy``
(``RAY_SERVE_ENABLE_HA_PROXY=1`` in Ray's environment): HAProxy listens on the graph's
port and forwards each connection to the ingress replica's own HTTP server. What the
Python proxy path guarantees must hold here too: exact streams under concurrency, the
bearer key, OpenAI-style 4xx bodies, and a client that goes away freeing its slot.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from br_serve.serve.cli import HAPROXY_ENV
from tests.serve.helpers import expected_texts, free_port, start_ray, stream_completion

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "br-emulated"
KEY = "front-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    import ray
    from ray import serve

    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    before = os.environ.get(HAPROXY_ENV)
    os.environ[HAPROXY_ENV] = "1"  # as br_serve.serve.cli.start_ray does for haproxy
    try:
        start_ray()
        p = free_port()
        deploy(parse_graph_config(replicas=2, prefill_replicas=1, serve_port=p,
                                  step_b_s=0.01, serve_barrier_timeout_s=5,
                                  serve_api_key=KEY, serve_front="haproxy"))
        yield p
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    finally:
        if before is None:
            os.environ.pop(HAPROXY_ENV, None)
        else:
            os.environ[HAPROXY_ENV] = before


def _listener_comm(port: int) -> set[str]:
    """The command names of the processes that listen on 127.0.0.1:``port``."""
    hexport = f"{port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[1].endswith(":" + hexport) and f[3] == "0A":  # LISTEN
                inodes.add(f[9])
    names = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    names.add((d / "comm").read_text().strip())
                    break
        except OSError:
            continue
    return names


def test_haproxy_is_the_front_door(port: int) -> None:
    """The graph's port is HAProxy's, not Serve's Python proxy's, and ``deploy``
    returned with the direct path to the ingress replica up."""
    from br_serve.serve.front import servers

    assert _listener_comm(port) == {"haproxy"}
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
    rows = servers("balance_route")
    assert [s.status for s in rows if not s.backup] == ["UP"], rows  # one ingress replica
    assert [s.backup for s in rows].count(True) == 1, rows  # Serve's proxy, the fallback


def test_concurrent_streams_are_exact(port: int) -> None:
    """64 concurrent streams through HAProxy each get exactly their tokens, over the
    direct path (the replica's server took every connection, the fallback none)."""
    from br_serve.serve.front import servers

    before = {s.name: s.sessions_total for s in servers("balance_route")}
    async def run() -> list[object]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120,
                                     limits=httpx.Limits(max_connections=100)) as c:
            return await asyncio.gather(*(stream_completion(
                c, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 16,
                                       "seed": 100 + i}, headers=AUTH) for i in range(64)))

    results = asyncio.run(run())
    for i, res in enumerate(results):
        assert res.status == 200 and res.done and res.error is None, (i, res)  # type: ignore[attr-defined]
        assert res.texts == expected_texts(100 + i, 2, 16), i  # type: ignore[attr-defined]
    after = servers("balance_route")
    grew = {s.backup: s.sessions_total - before.get(s.name, 0) for s in after}
    assert grew[True] == 0 and grew[False] >= 1, after


def test_key_and_bad_input_get_openai_errors(port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    r = httpx.post(f"{base}/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": "a", "max_tokens": 4})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(f"{base}/v1/completions", timeout=30, headers=AUTH,
                   json={"model": MODEL, "prompt": "a", "max_tokens": -1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "max_tokens"


def test_client_gone_frees_its_slot(port: int) -> None:
    """A streaming client that disconnects: HAProxy closes the replica's connection, the
    ingress gives the request up, and no decode slot stays taken."""
    base = f"http://127.0.0.1:{port}"

    async def cut() -> int:
        # 200 s of decode if the request were never given up
        body = {"model": MODEL, "prompt": "a b", "max_tokens": 20000, "stream": True}
        async with httpx.AsyncClient(base_url=base, timeout=60) as c, \
                c.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= 3:
                    break
            return r.status_code

    assert asyncio.run(cut()) == 200

    def running() -> int:
        state = httpx.get(f"{base}/v1/br/state", headers=AUTH, timeout=30).json()
        return sum(r["running"] for r in state["replicas"])

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert running() == 0
    r = httpx.post(f"{base}/v1/completions", timeout=60, headers=AUTH,
                   json={"model": MODEL, "prompt": "c d", "max_tokens": 5, "seed": 4})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "".join(expected_texts(4, 2, 5))
