"""The ingress at two replicas (Serve's ``num_replicas``; real Ray Serve, one cluster).

The graph's actors belong to its ``Actors`` deployment, not to an ingress replica, so
two ingress replicas share one scheduler and the decode replicas, each streaming its
own requests. 200 concurrent streams through Serve's proxy (which spreads them over
both): every one completes with exactly the requested tokens (none lost, none
duplicated, the emulated engine's tokens for its seed), both replicas served some,
and each decode replica delivers to both over their event channels. Then one ingress
replica is killed while streams run: every stream ends (exact, or broken with its
connection) and the graph serves exactly again, with no actor recreated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serve.helpers import expected_texts, free_port, start_ray, stream_completion

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400)]

MODEL = "br-emulated"
APP = "br_two_ingress"
G = 2
NS = "br_serve"


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    import ray
    from ray import serve

    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    start_ray()
    p = free_port()
    deploy(parse_graph_config(serve_app_name=APP, replicas=G, prefill_replicas=2,
                              pool_capacity=256, serve_ingress_replicas=2, serve_port=p,
                              step_b_s=0.02, serve_barrier_timeout_s=5))
    yield p
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


async def _streams(port: int, n: int, max_tokens: int, seed0: int = 1000) -> list[Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=180) as c:
        return list(await asyncio.gather(*(
            stream_completion(c, "/v1/completions",
                              {"model": MODEL, "prompt": " ".join(["w"] * (5 + i % 7)),
                               "max_tokens": max_tokens, "seed": seed0 + i})
            for i in range(n)), return_exceptions=True))


def _exact(r: Any, i: int, max_tokens: int, seed0: int = 1000) -> bool:
    return (not isinstance(r, BaseException) and r.status == 200 and r.error is None
            and r.done and r.finish_reason == "length"
            and r.texts == expected_texts(seed0 + i, 5 + i % 7, max_tokens))


def _owner(public_id: str | None) -> str:
    """The ingress replica that served a stream: its request ids start with its owner
    id (``cmpl-ingress-<hex>-<n>``)."""
    assert public_id is not None and public_id.startswith("cmpl-ingress-"), public_id
    return public_id.removeprefix("cmpl-").rsplit("-", 1)[0]


def _decode_ids() -> list[str]:
    import ray

    return [ray.get_actor(f"{APP}:decode:{g}", namespace=NS)._actor_id.hex()
            for g in range(G)]


def test_200_streams_are_exact_across_two_ingress_replicas(port: int) -> None:
    import ray

    results = asyncio.run(_streams(port, 200, 20))
    bad = [i for i, r in enumerate(results) if not _exact(r, i, 20)]
    assert not bad, [results[i] for i in bad[:3]]
    owners = {_owner(r.id) for r in results}
    assert len(owners) == 2, owners  # Serve's proxy used both replicas
    stats = ray.get([ray.get_actor(f"{APP}:decode:{g}", namespace=NS).proc_stats.remote()
                     for g in range(G)])
    assert all(s["channels_open"] == 2 for s in stats), stats


def _ingress_replicas() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"SERVE_REPLICA::{APP}#Ingress#")]


def test_killing_one_ingress_replica_keeps_the_graph(port: int) -> None:
    """Streams on the killed replica break (their connection closes); the others
    complete exactly; the decode replicas and scheduler are the same actors after."""
    import ray

    before = _decode_ids()

    async def run() -> list[Any]:
        task = asyncio.ensure_future(_streams(port, 40, 60, seed0=5000))
        await asyncio.sleep(1.0)
        victim = _ingress_replicas()[0]
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=False)
        return await task

    results = asyncio.run(run())
    exact = sum(_exact(r, i, 60, seed0=5000) for i, r in enumerate(results))
    for i, r in enumerate(results):  # none hangs or returns wrong tokens silently
        if not isinstance(r, BaseException) and r.error is None and r.done:
            assert _exact(r, i, 60, seed0=5000), (i, r)
    assert exact >= 1, results[:3]
    assert _decode_ids() == before  # the graph's actors outlived the ingress replica
    deadline = time.monotonic() + 120
    while len(_ingress_replicas()) < 2 and time.monotonic() < deadline:
        time.sleep(1.0)
    again = asyncio.run(_streams(port, 20, 10, seed0=7000))
    assert all(_exact(r, i, 10, seed0=7000) for i, r in enumerate(again)), again[:3]
