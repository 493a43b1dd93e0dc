"""Diagnostic, not a test (no ``test_`` file name, so the suite never collects it): the
graph's first-event delay on real vLLM, per layout. Run explicitly:

    BR_REAL_VLLM=1 RAY_AUTH_MODE=disabled .venv/bin/python -m pytest -q -s \
        tests/realvllm/probe_first_event.py -k dp2

It streams ``N`` requests of 1,800 tokens one after another, alternating the HTTP front
door and the Serve handle, and prints per request the time to the first event, the
total time and the events received. With two decode ranks (DP=2 and external DP) the
first event trailed the engine's decode by 1.6-9 s in about one request of three, with
every token arriving together afterwards: the replicas' step threads and barrier were
descheduled on the saturated 2-core host (docs/vllm-cpu.md, "Known problem").
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from tests.realvllm import test_graph
from tests.realvllm.test_graph import Graph, _prompt

graph = test_graph.graph  # the module-scoped fixture, one graph per layout

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1800)]
N = int(os.environ.get("BR_PROBE_REQUESTS", "14"))


def _http(graph: Graph, prompt: str, t0: float) -> tuple[float, int]:
    first, n = -1.0, 0
    with httpx.stream("POST", f"{graph.base}/v1/completions", timeout=300,
                      json={"prompt": prompt, "max_tokens": 1800, "ignore_eos": True,
                            "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                n += 1
                first = first if first >= 0 else time.time() - t0
    return first, n


def _handle(graph: Graph, prompt: str, t0: float, seed: int) -> tuple[float, int]:
    async def go() -> tuple[float, int]:
        first, n = -1.0, 0
        async for _ in graph.handle().generate_stream.remote(prompt, max_tokens=1800,
                                                             seed=seed):
            n += 1
            first = first if first >= 0 else time.time() - t0
        return first, n
    return asyncio.run(go())


def test_first_event_delay(graph: Graph) -> None:
    for i in range(20, 20 + N):
        t0 = time.time()
        kind = "handle" if i % 2 else "http"
        first, n = (_handle(graph, _prompt(graph.layout, i), t0, i) if i % 2
                    else _http(graph, _prompt(graph.layout, i), t0))
        print(f"PROBE {graph.layout} {kind} i={i} first_event_s={first:.2f} "
              f"total_s={time.time() - t0:.2f} events={n}")
