"""Real vLLM (CPU build, tiny model) in the three layouts the graph drives, checked at
the engine: external DP (one server per rank), one server with ``--data-parallel-size
2`` and rank pinning, PD through vLLM's ``ExampleConnector`` (KV in a shared directory).

What these show about vLLM itself (the graph's tests over them: test_graph.py):
rank pinning lands on the named engine (vLLM's per-engine counters), the connector
really moves KV (files written by the prefill, loaded by the decode: its external
prefix-cache counters), a client that disconnects aborts its engine request.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import httpx
import pytest

from tests.realvllm import servers as sv
from tests.realvllm.conftest import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

#: 80 words: longer than two KV blocks of 32, so the connector stores and finds KV
LONG = " ".join(f"w{(7 * i) % 400}" for i in range(80))


def complete(url: str, prompt: str, max_tokens: int, **headers: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", headers=headers, timeout=120,
                   json={"model": sv.SERVED_MODEL, "prompt": prompt, "max_tokens": max_tokens,
                         "ignore_eos": True})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_dp2_rank_header_lands_on_that_engine(fleet: Fleet) -> None:
    dp2 = fleet.dp2
    before = [dp2.metric("vllm:request_success_total", engine=str(g)) for g in (0, 1)]
    for g in (1, 1, 1, 0):
        complete(dp2.url, "w1 w2 w3", 2, **{"X-data-parallel-rank": str(g)})
    after = [dp2.metric("vllm:request_success_total", engine=str(g)) for g in (0, 1)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 3]


def test_external_dp_servers_are_independent(fleet: Fleet) -> None:
    plain_pair = [fleet.decode, fleet.decode2]
    before = [s.metric("vllm:request_success_total") for s in plain_pair]
    complete(plain_pair[1].url, "w1 w2", 2)
    after = [s.metric("vllm:request_success_total") for s in plain_pair]
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 1]


def test_example_connector_moves_kv_from_prefill_to_decode(fleet: Fleet) -> None:
    p, d, store = fleet.prefill, fleet.decode, fleet.store
    files_before = set(store.rglob("*.safetensors"))
    pre = complete(p.url, LONG, 1)
    assert pre.get("kv_transfer_params") is None  # this connector hands nothing back
    written = set(store.rglob("*.safetensors")) - files_before
    assert written, "the prefill stored no KV in the shared directory"
    hits_before = d.metric("vllm:external_prefix_cache_hits_total")
    out = complete(d.url, LONG, 8)
    assert out["usage"]["completion_tokens"] == 8
    hits = d.metric("vllm:external_prefix_cache_hits_total") - hits_before
    assert hits >= 64, f"decode loaded {hits} tokens from the connector (want >= 64)"
    # the connector never deletes what it stored (a prefill that never decodes leaves it)
    assert written <= set(store.rglob("*.safetensors"))


def test_client_disconnect_aborts_the_engine_request(fleet: Fleet) -> None:
    """The server aborts the requests of clients that leave mid-stream: its running gauge
    falls back to 0 and it logs each abort with the request's id. (vLLM 0.32's
    ``vllm:request_success_total{finished_reason="abort"}`` is printed: the abort path
    drops the request's state before the stats are taken.)"""
    s = fleet.decode2
    n = 6  # decoded as one batch, 500 steps each: still running when the clients go
    body = {"model": sv.SERVED_MODEL, "prompt": "w1 w2 w3", "max_tokens": 500,
            "ignore_eos": True, "stream": True}
    aborts0 = s.metric("vllm:request_success_total", finished_reason="abort")
    ids = []
    with contextlib.ExitStack() as streams:
        lines = [streams.enter_context(httpx.stream(
            "POST", f"{s.url}/v1/completions", json=body, timeout=60)).iter_lines()
            for _ in range(n)]
        for it in lines:
            first = next(x for x in it if x.startswith("data: {"))
            ids.append(json.loads(first[6:])["id"])
        running = s.metric("vllm:num_requests_running")
    assert running >= 1, running
    deadline = time.monotonic() + 60
    while s.metric("vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert s.metric("vllm:num_requests_running") == 0
    aborts = s.metric("vllm:request_success_total", finished_reason="abort") - aborts0
    logged = [rid for rid in ids
              if any("abort" in x.lower() and rid in x for x in s.log().splitlines())]
    print(f"\n{running:g} of {n} running when the clients left; {len(logged)} aborts "
          f"logged; abort counter delta {aborts:g}")
    assert len(logged) >= running, (logged, running)
