"""The graph in front of real vLLM (CPU build, tiny model), deployed as the README says
(no ``remote.model``: the graph discovers it), in the PD layout with vLLM's
``ExampleConnector``: ``remote.kv_handoff=prompt`` (the prefill answer carries no
transfer parameters; the decode request carries the same prompt and the connector finds
the KV by it).

Needs the graph's model discovery and ``remote.kv_handoff`` (branch ``vgraph``); skipped,
saying so, on a tree without them. Checks: streams complete through the graph's OpenAI
API; the decode loaded the KV (its external prefix-cache hits); a client that leaves
mid-stream ends the engine's request (running gauge back to 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.realvllm import servers as sv
from tests.realvllm.conftest import READY_S
from tests.realvllm.test_engines import LONG, example_connector
from tests.serve.helpers import free_port, start_ray, stream_completion

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def graph_pd(tiny_model: Path, vllm_logs: Path, tmp_path_factory: pytest.TempPathFactory,
             ) -> Iterator[tuple[str, sv.VllmServer]]:
    from br_serve.serve.config import parse_graph_config

    try:
        parse_graph_config(engine="vllm", remote_prefill_urls="http://127.0.0.1:1",
                           remote_decode_urls="http://127.0.0.1:2", remote_kv_handoff="prompt")
    except Exception as exc:  # any refusal naming the field means: not in this tree
        if "kv_handoff" in str(exc):
            pytest.skip(f"this tree has no remote.kv_handoff (branch vgraph): {exc}")
    import ray
    from ray import serve

    from br_serve.serve.graph import deploy

    store = tmp_path_factory.mktemp("graph-kv")
    p = sv.start("graph-prefill", tiny_model, free_port(), vllm_logs,
                 example_connector("kv_producer", store))
    d = sv.start("graph-decode", tiny_model, free_port(), vllm_logs,
                 example_connector("kv_consumer", store))
    port = free_port()
    try:
        sv.wait_ready([p, d], READY_S)
        start_ray()
        deploy(parse_graph_config(engine="vllm", remote_prefill_urls=p.url,
                                  remote_decode_urls=d.url, remote_kv_handoff="prompt",
                                  prefill_replicas=1, serve_port=port,
                                  serve_app_name="br_realvllm"),
               route_prefix="/br_realvllm")
        yield f"http://127.0.0.1:{port}/br_realvllm", d
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        p.stop()
        d.stop()


def test_streams_complete_and_decode_loads_the_prefilled_kv(
        graph_pd: tuple[str, sv.VllmServer]) -> None:
    base, d = graph_pd
    hits0 = d.metric("vllm:external_prefix_cache_hits_total")

    async def go() -> list[object]:
        async with httpx.AsyncClient(base_url=base, timeout=300) as c:
            return list(await asyncio.gather(*(stream_completion(
                c, "/v1/completions", {"prompt": f"{LONG} w{400 + i}", "max_tokens": 6,
                                       "ignore_eos": True}) for i in range(3))))

    results = asyncio.run(go())
    for r in results:
        assert r.status == 200 and r.done and r.error is None, r  # type: ignore[attr-defined]
        assert len(r.texts) == 6, r  # type: ignore[attr-defined]
    hits = d.metric("vllm:external_prefix_cache_hits_total") - hits0
    assert hits >= 3 * 64, f"decode loaded {hits} prompt tokens from the connector"


def test_client_gone_mid_stream_ends_the_engine_request(
        graph_pd: tuple[str, sv.VllmServer]) -> None:
    base, d = graph_pd
    body = {"prompt": LONG, "max_tokens": 150, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        lines = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(json.loads(line[len("data: "):]))
            if len(lines) >= 3:
                break
        assert all("choices" in ev for ev in lines), lines  # token chunks arrived
    deadline = time.monotonic() + 60
    while d.metric("vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert d.metric("vllm:num_requests_running") == 0
