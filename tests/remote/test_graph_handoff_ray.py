"""The graph over vLLM-protocol engines as README writes it (no ``remote.model``): the
model is discovered, the KV hand-off runs by transfer parameters or by prompt (a
prompt-keyed connector, the emulator's ``kv_store_dir``), and a deployment that could
never serve (a wrong model, a prefill answer without parameters in ``params`` mode, an
unreachable engine) fails within 60 s with a message naming the cause. One Ray
cluster for the module; the engine emulators run in threads of the test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.emulator.helpers import config, servers
from tests.serve.helpers import expected_texts, free_port, start_ray, stream_completion

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

G = 2
BOUND_S = 60.0


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    import ray
    from ray import serve

    start_ray()
    yield free_port()
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def _deploy(port: int, app: str, prefill_url: str, decode_url: str, **kw: Any) -> None:
    """Deploy as README writes it: engine, URLs, ``dp_size``; no model, nothing hidden."""
    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    kw.setdefault("remote_dp_size", G)
    deploy(parse_graph_config(engine="vllm", remote_prefill_urls=prefill_url,
                              remote_decode_urls=decode_url, prefill_replicas=1,
                              serve_port=port, serve_app_name=app,
                              serve_barrier_timeout_s=5, **kw),
           route_prefix=f"/{app}")


async def _streams(base: str, n: int, max_tokens: int) -> list[Any]:
    async with httpx.AsyncClient(base_url=base, timeout=120) as c:
        return list(await asyncio.gather(*(
            stream_completion(c, "/v1/completions",
                              {"model": "br-emulated", "prompt": " ".join(["w"] * (3 + i)),
                               "max_tokens": max_tokens, "seed": 500 + i})
            for i in range(n))))


def _check_exact(results: list[Any], max_tokens: int) -> None:
    for i, r in enumerate(results):
        assert r.status == 200 and r.error is None, (i, r)
        assert r.texts == expected_texts(500 + i, 3 + i, max_tokens), i


@pytest.mark.parametrize("mode", ["prompt", "auto"])
def test_prompt_keyed_handoff_streams_exact_with_the_model_discovered(
        http_port: int, tmp_path: Path, mode: str) -> None:
    from ray import serve

    store = str(tmp_path)
    app = f"br_handoff_{mode}"
    pre = config("vllm", "prefill", 1, kv_store_dir=store, model="tiny-x")
    dec = config("vllm", "decode", G, kv_store_dir=store, model="tiny-x")
    n, max_tokens = 6, 8
    with servers(pre, dec) as (p, d):
        try:
            kw = {} if mode == "auto" else {"remote_kv_handoff": mode}
            _deploy(http_port, app, p.url, d.url, **kw)
            results = asyncio.run(_streams(f"http://127.0.0.1:{http_port}/{app}", n,
                                           max_tokens))
            stats = httpx.get(d.url + "/emulator/stats", timeout=10).json()
        finally:
            with contextlib.suppress(Exception):
                serve.delete(app)
    _check_exact(results, max_tokens)
    pulls = sum(r["kv_pulls"] for r in stats["ranks"])
    recomputes = sum(r["kv_recomputes"] for r in stats["ranks"])
    # every decode (the n requests and the ingress's warm-up) found its prompt's KV
    assert recomputes == 0 and pulls == n + 1, (pulls, recomputes)
    assert len(os.listdir(store)) == n + 1  # one stored prompt each (warm-up included)


def test_params_handoff_streams_exact_with_the_model_discovered(http_port: int) -> None:
    from ray import serve

    app = "br_handoff_params"
    n, max_tokens = 6, 8
    with servers(config("vllm", "prefill", 1, model="tiny-y"),
                 config("vllm", "decode", G, model="tiny-y")) as (p, d):
        try:
            _deploy(http_port, app, p.url, d.url, remote_kv_handoff="params")
            results = asyncio.run(_streams(f"http://127.0.0.1:{http_port}/{app}", n,
                                           max_tokens))
            stats = httpx.get(d.url + "/emulator/stats", timeout=10).json()
        finally:
            with contextlib.suppress(Exception):
                serve.delete(app)
    _check_exact(results, max_tokens)
    assert sum(r["kv_pulls"] for r in stats["ranks"]) == n + 1


def _failing_deploy(port: int, app: str, prefill_url: str, decode_url: str,
                    **kw: Any) -> tuple[str, float]:
    from ray import serve

    from br_serve.serve.config import GraphConfigError

    t0 = time.monotonic()
    try:
        with pytest.raises((GraphConfigError, RuntimeError)) as err:
            _deploy(port, app, prefill_url, decode_url, **kw)
    finally:
        with contextlib.suppress(Exception):
            serve.delete(app)
    return str(err.value), time.monotonic() - t0


def test_a_wrong_model_fails_the_deployment_naming_it(http_port: int) -> None:
    with servers(config("vllm", "prefill", 1), config("vllm", "decode", G)) as (p, d):
        msg, took = _failing_deploy(http_port, "br_wrong_model", p.url, d.url,
                                    remote_model="br-emulated")
    assert "remote.model: 'br-emulated' is not served by" in msg, msg
    assert f"{d.url} serves ['emulated']" in msg, msg
    assert took < BOUND_S, took


def test_different_models_fail_the_deployment_naming_them(http_port: int) -> None:
    with servers(config("vllm", "prefill", 1, model="a"),
                 config("vllm", "decode", G, model="b")) as (p, d):
        msg, took = _failing_deploy(http_port, "br_two_models", p.url, d.url)
    assert "serve different models" in msg and "['a']" in msg and "['b']" in msg, msg
    assert took < BOUND_S, took


def test_a_missing_connector_in_params_mode_fails_the_deployment(http_port: int,
                                                                 tmp_path: Path) -> None:
    store = str(tmp_path)
    with servers(config("vllm", "prefill", 1, kv_store_dir=store),
                 config("vllm", "decode", G, kv_store_dir=store)) as (p, d):
        msg, took = _failing_deploy(http_port, "br_no_params", p.url, d.url,
                                    remote_kv_handoff="params")
    assert "the prefill answer has no kv_transfer_params" in msg, msg
    assert took < BOUND_S, took


def test_an_unreachable_engine_fails_the_deployment(http_port: int) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with servers(config("vllm", "prefill", 1)) as (p,):
        msg, took = _failing_deploy(http_port, "br_unreachable", p.url, closed)
    assert f"remote.decode_urls[0] {closed}: cannot reach the engine" in msg, msg
    assert took < BOUND_S, took


def test_serve_run_exits_with_the_error() -> None:
    """``serve run graphs.balance_route:build ...`` with a model the engines do not
    serve exits non-zero within the bound, printing the cause (no hang)."""
    serve_bin = Path(sys.executable).with_name("serve")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    # what the CLI costs before the builder runs (imports of Ray Serve and the graph):
    # the machine's, not the deployment's; measured beside it, in the same conditions
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import ray.serve.scripts, graphs.balance_route"],
                   check=True, cwd=root, env=env, timeout=300)
    imports_s = time.monotonic() - t0
    with servers(config("vllm", "prefill", 1), config("vllm", "decode", G)) as (p, d):
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(serve_bin), "run", "graphs.balance_route:build", "engine=vllm",
             f"remote.prefill_urls={p.url}", f"remote.decode_urls={d.url}",
             f"remote.dp_size={G}", "remote.model=nope"],
            capture_output=True, text=True, timeout=BOUND_S + imports_s + 60, cwd=root,
            env=env)
        took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "remote.model: 'nope' is not served by" in out, out[-2000:]
    print(f"serve run exited after {took:.1f} s (imports alone {imports_s:.1f} s)")
    assert took - imports_s < BOUND_S, (took, imports_s)
