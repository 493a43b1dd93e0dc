"""Fixtures of the real-vLLM tests: the venv (``.ci/setup-vllm``), a tiny model built at
test time, the real vLLM servers (:class:`Fleet`) and a Ray cluster, each started once for
this package (``scope="package"``: stopped before the other test packages run, which
start Ray themselves).

They run in the README's test command (``bash .ci/setup && .venv/bin/python -m pytest
-q``); skipped, with the reason, only when the vLLM venv cannot be built (no network, no
wheel for this platform), or when ``BR_REAL_VLLM=0`` switches them off; with
``BR_REAL_VLLM=1`` (as CI sets it) a venv that cannot be built fails them instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realvllm import servers as sv
from tests.serve.helpers import free_port, start_ray

#: a server on a quiet 2-core machine is ready in about a minute (four start together);
#: a loaded one took up to 8 min
READY_S = float(os.environ.get("BR_REAL_VLLM_READY_S", "900"))


@pytest.fixture(scope="package")
def vllm_venv() -> Path:
    if os.environ.get("BR_REAL_VLLM") == "0":
        pytest.skip("BR_REAL_VLLM=0: the real-vLLM tests are switched off")
    reason = sv.ensure_venv()
    if reason is not None:
        if os.environ.get("BR_REAL_VLLM") == "1":  # CI: the real engine is required
            pytest.fail(f"BR_REAL_VLLM=1 but real vLLM is unavailable: {reason}")
        pytest.skip(f"real vLLM unavailable: {reason}")
    return sv.VENV


@pytest.fixture(scope="package")
def tiny_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sv.build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="package")
def vllm_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


def example_connector(path: Path, role: str = "kv_both") -> list[str]:
    """vLLM's ``ExampleConnector`` (KV as safetensors files in ``path``, keyed by the
    prompt), as the README's "Deploy over vLLM" starts every server."""
    cfg = {"kv_connector": "ExampleConnector", "kv_role": role,
           "kv_connector_extra_config": {"shared_storage_path": str(path)}}
    return ["--kv-transfer-config", json.dumps(cfg)]


@dataclass(frozen=True, slots=True)
class Fleet:
    """The servers every real-vLLM test shares, started together once for the package (each
    start costs about a minute of CPU): all run ``ExampleConnector`` on ``store``, as the
    README deploys them. ``decode`` and ``decode2``: one server per DP rank (external DP;
    ``decode`` alone is the PD layout and the conformance test's engine); ``dp2``: one
    server with ``--data-parallel-size 2``."""

    prefill: sv.VllmServer
    decode: sv.VllmServer
    decode2: sv.VllmServer
    dp2: sv.VllmServer
    store: Path


@pytest.fixture(scope="package")
def fleet(tiny_model: Path, vllm_logs: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    store = tmp_path_factory.mktemp("kv-store")
    kv = example_connector(store)
    started: list[sv.VllmServer] = []
    try:
        # the DP=2 server first, alone until its DP coordinator is up: vLLM gives that
        # process a fixed 120 s to report, which four servers importing torch at once on
        # a busy 2-core host exceed
        dp2 = sv.start("dp2", tiny_model, free_port(), vllm_logs,
                       [*kv, "--data-parallel-rpc-port", str(free_port())], dp_size=2)
        started.append(dp2)
        sv.wait_log(dp2, "Started DP Coordinator", READY_S)
        for name in ("prefill", "decode", "decode2"):
            started.append(sv.start(name, tiny_model, free_port(), vllm_logs, kv))
        sv.wait_ready(started, READY_S)
        yield Fleet(prefill=started[1], decode=started[2], decode2=started[3], dp2=dp2,
                    store=store)
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="package")
def serve_port(fleet: Fleet) -> Iterator[int]:
    """One local Ray cluster and Serve HTTP proxy for the graph tests (the README's
    ``serve run`` starts the same before it calls the builder); apps get route prefixes."""
    import contextlib

    import ray
    from ray import serve

    port = free_port()
    for attempt in range(3):  # Ray gives its raylet a fixed 30 s, short on a loaded host
        try:
            start_ray()
            break
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            ray.shutdown()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
