"""The disaggregated path on a real local Ray cluster, with both KV transports.

A prefill actor runs ``TorchEngine.prefill`` and puts the KV through the transport; a
decode actor pulls it, admits several requests at different times and steps them
together; the tokens must equal ``model.generate`` greedy output for every prompt.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from br_serve.engine.base import SamplingParams

from .conftest import PROMPTS, generate_greedy, needs_mooncake

pytestmark = [pytest.mark.ray, pytest.mark.slow]

N_NEW = 8


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")
    import ray

    ray.init(include_dashboard=False, num_cpus=2, object_store_memory=300 * 1024**2,
             log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _disaggregated(model: Path, transport: str, options: dict[str, Any] | None
                   ) -> dict[int, list[int]]:
    import ray

    from br_serve.bench.workers import DecodeEndpoint, PrefillEndpoint, spawn

    engine = {"kind": "torch", "model_path": str(model), "max_batch": 4}
    pre = spawn(PrefillEndpoint, engine, transport, options, num_cpus=0)
    dec = spawn(DecodeEndpoint, engine, transport, options, num_cpus=0)
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    out: dict[int, list[int]] = {}
    admit_at = {0: [0, 1, 2], 2: [3], 3: [4]}  # later arrivals join a running batch
    step = 0
    try:
        while admit_at or ray.get(dec.running.remote()):
            for i in admit_at.pop(step, []):
                res, handle = ray.get(pre.prefill.remote(f"r{i}", PROMPTS[i], params))
                assert res.kv is None and handle.transport == transport and handle.nbytes > 0
                out[i] = [res.first_token_id]
                ray.get(dec.admit.remote(res, handle, params))
            for ev in ray.get(dec.step.remote()):
                out[int(ev.request_id[1:])].append(ev.token_id)
            step += 1
    finally:
        for actor in (pre, dec):
            ray.get(actor.close.remote())
            ray.kill(actor)
    return out


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> list[list[int]]:
    return generate_greedy(tiny_model, PROMPTS, N_NEW)


def test_objref_path_equals_generate(ray_cluster: None, tiny_model: Path,
                                     reference: list[list[int]]) -> None:
    out = _disaggregated(tiny_model, "objref", None)
    assert [out[i] for i in range(len(PROMPTS))] == reference


@needs_mooncake
def test_mooncake_path_equals_generate(ray_cluster: None, tiny_model: Path,
                                       mooncake_master: str,
                                       reference: list[list[int]]) -> None:
    opts = {"master_address": mooncake_master, "global_segment_size": 32 * 1024**2,
            "local_buffer_size": 16 * 1024**2}
    out = _disaggregated(tiny_model, "mooncake", opts)
    assert [out[i] for i in range(len(PROMPTS))] == reference


@needs_mooncake
def test_bench_kv_command(ray_cluster: None, mooncake_master: str, tmp_path: Path) -> None:
    import json

    from br_serve.cli import main

    out = tmp_path / "kv.json"
    rc = main(["bench-kv", "--sizes-mib", "1", "--reps", "1", "--mooncake-master",
               mooncake_master, "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    rows = {(r["transport"], r["size_mib"]) for r in report["results"]}
    assert rows == {("objref", 1), ("mooncake", 1)}
    for r in report["results"]:
        assert r["mb_per_s"] > 0 and r["put_s"] > 0 and r["get_s"] > 0


def test_bench_kv_bad_input() -> None:
    from br_serve.cli import main

    assert main(["bench-kv", "--transports", "nccl"]) == 2
    assert main(["bench-kv", "--sizes-mib", "0"]) == 2
