"""What the field's routers read from a worker, as the emulator serves it by default.

smg / sglang-router's ``--dp-aware`` worker workflow (``/server_info`` with its
``/get_server_info`` fallback, ``/model_info``, ``/v1/models`` ``owned_by``), smg's
``/v1/loads`` parser (integers where it reads ``i32``), SGLang's
``disagg_prefill_dp_rank`` and ``follow_bootstrap_room``, vLLM's acceptance of unknown
fields and its ``X-Request-Id`` response id; the step log of the barrier.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from br_serve.emulator.config import EmulatorConfig
from br_serve.emulator.server import EmulatorThread
from br_serve.emulator.steplog import StepLog, summarise_rows
from tests.emulator.helpers import config, expected_texts, servers
from tests.serve.helpers import free_port

G = 4


@pytest.fixture(scope="module")
def sg() -> Iterator[tuple[EmulatorThread, EmulatorThread]]:
    # the defaults a user gets (no --strict-fields), as the routers meet them
    pre = EmulatorConfig("sglang", "prefill", 2, free_port())
    dec = EmulatorConfig("sglang", "decode", G, free_port(), step_b_s=(0.002,),
                         step_a_s_per_token=(0.0,), slots=3, bootstrap_wait_s=2.0)
    with servers(pre, dec) as (p, d):
        yield p, d


def test_server_info_and_model_info_under_both_names(sg: Any) -> None:
    _, d = sg
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(d.url + path).json()
        assert info["dp_size"] == G and info["model_path"] == "emulated"
        assert info["disaggregation_mode"] == "decode"
        # the server argument is the total over DP-attention ranks
        assert info["max_running_requests"] == 3 * G
    for path in ("/model_info", "/get_model_info"):
        assert httpx.get(d.url + path).json()["is_generation"] is True
    assert httpx.get(d.url + "/v1/models").json()["data"][0]["owned_by"] == "sglang"


def _pd(p: EmulatorThread, d: EmulatorThread, room: int, **decode_fields: Any
        ) -> httpx.Response:
    import contextlib
    import threading

    def prefill() -> None:
        # a refused decode leaves the prefill holding its room (until its TTL, as
        # SGLang's bootstrap timeout): its answer never comes within this test
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(p.url + "/v1/completions", json=body, timeout=5)

    body = {"model": "emulated", "prompt": "one two three", "max_tokens": 4, "seed": 3,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": p.config.port,
            "bootstrap_room": room, "no_such_field": 1}
    pre = threading.Thread(target=prefill)
    pre.start()
    r = httpx.post(d.url + "/v1/completions", json={**body, **decode_fields}, timeout=10)
    pre.join()
    return r


def test_follow_bootstrap_room_and_disagg_prefill_dp_rank(sg: Any) -> None:
    p, d = sg
    # the prefill (dp 2, no rank) holds room 7 on rank 7 % 2 = 1; a decode naming rank 1,
    # or none (the prefill fills in room % dp_size), takes it
    r = _pd(p, d, 7, disagg_prefill_dp_rank=1, routed_dp_rank=2)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "".join(expected_texts("one two three", 4,
                                                                    seed=3))
    assert _pd(p, d, 9).status_code == 200
    # naming the other rank is refused, as a wrong bootstrap rank fails the transfer
    bad = _pd(p, d, 11, disagg_prefill_dp_rank=0)
    assert bad.status_code == 400 and "prefill_dp_rank" in bad.json()["message"]
    st = httpx.get(d.url + "/emulator/stats").json()
    assert st["ignored_fields"]["no_such_field"] >= 2
    assert "rid" not in st["ignored_fields"]


def test_v1_loads_in_the_shape_smg_parses(sg: Any) -> None:
    _, d = sg
    out = httpx.get(d.url + "/v1/loads", params={"include": "core,disagg,queues,memory"})
    js = out.json()
    assert isinstance(js["timestamp"], str) and js["dp_rank_count"] == G
    for row in js["loads"]:
        for k in ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens",
                  "max_total_num_tokens", "num_waiting_uncached_tokens",
                  "max_running_requests"):
            assert isinstance(row[k], int), k
        assert isinstance(row["token_usage"], float)
        assert isinstance(row["gen_throughput"], float) and row["gen_throughput"] >= 0


def test_step_log_endpoints(sg: Any) -> None:
    _, d = sg
    barrier = httpx.get(d.url + "/emulator/barrier").json()
    steps = httpx.get(d.url + "/emulator/steps", params={"since": 1}).json()
    assert barrier["steps"] >= 4 and steps["rows"][0][0] == 1
    assert steps["columns"][4] == "loads" and len(steps["rows"][0][4]) == G
    assert barrier["tokens"] == sum(sum(r[5]) for r in
                                    httpx.get(d.url + "/emulator/steps").json()["rows"])
    assert httpx.get(d.url + "/emulator/steps", params={"since": -1}).status_code == 400


def test_vllm_accepts_unknown_fields_by_default_and_strict_refuses() -> None:
    lenient = (EmulatorConfig("vllm", "prefill", 1, free_port()),)
    strict = (config("vllm", "prefill"),)
    body = {"model": "emulated", "prompt": "a b", "max_tokens": 1, "stream": False,
            "no_stop_trim": True, "kv_transfer_params": {"do_remote_decode": True}}
    with servers(*lenient) as (p,):
        r = httpx.post(p.url + "/v1/completions", json=body,
                       headers={"X-Request-Id": "abc"})
        assert r.status_code == 200 and r.json()["id"] == "cmpl-abc"
        assert httpx.get(p.url + "/emulator/stats").json()["ignored_fields"] == {
            "no_stop_trim": 1}
        assert httpx.get(p.url + "/version").status_code == 200
    with servers(*strict) as (p,):
        r = httpx.post(p.url + "/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "no_stop_trim"


def test_step_log_summary_by_hand() -> None:
    log = StepLog((1e-3, 1e-3), (0.01, 0.01))
    log.record(100.0, 0.02, 0.0, (10, 0), (2, 0), (1, 0))
    log.record(100.1, 0.016, 0.001, (6, 4), (1, 1), (0, 0))
    s = log.summary()
    assert s["steps"] == 2 and s["tokens"] == 4
    assert s["mean_imbalance_tokens"] == pytest.approx(((2 * 10 - 10) + (2 * 6 - 10)) / 2)
    # idle: step 1: rank 1 costs 0.01 of 0.02; step 2: rank 1 costs 0.014 of 0.016
    assert s["barrier_idle_share"] == pytest.approx((0.01 + 0.002) / (2 * 0.036))
    assert log.gen_throughput(0) == pytest.approx(3 / 0.037)
    rows = log.rows()
    again = summarise_rows(rows, (1e-3, 1e-3), (0.01, 0.01))
    assert again["mean_imbalance_tokens"] == s["mean_imbalance_tokens"]
    assert log.rows(since=1)[0][0] == 1 and log.rows(limit=1) == rows[:1]
