"""Pure client pieces: Prometheus / loads parsing, request builders, error bodies."""

from __future__ import annotations

import math
import random

import pytest

from br_serve.remote.errors import ErrorInfo, parse_error_body
from br_serve.remote.loads import (
    RankLoad,
    parse_prometheus,
    sglang_rank_loads,
    single_rank_load,
    vllm_rank_loads,
)
from br_serve.remote.requests import (
    VLLM_PREFILL_KV_PARAMS,
    Bootstrap,
    check_vllm_kv_params,
    new_bootstrap_room,
    sglang_decode_request,
    sglang_prefill_request,
    vllm_decode_request,
    vllm_prefill_request,
)

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
vllm:num_requests_running{engine="0",model_name="other"} 9.0
vllm:num_requests_waiting{model_name="m",engine="1"} 2.0 1712345678000
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
weird{path="a \\"q\\" b\\\\c\\nd",x="{,}"} +Inf
nolabels NaN
"""


def test_prometheus_parser_and_vllm_rank_loads() -> None:
    samples = parse_prometheus(METRICS)
    weird = next(s for s in samples if s.name == "weird")
    assert weird.label("path") == 'a "q" b\\c\nd' and weird.label("x") == "{,}"
    assert math.isinf(weird.value)
    assert math.isnan(next(s for s in samples if s.name == "nolabels").value)
    loads = vllm_rank_loads(METRICS, model_name="m")
    # kv_cache_usage_perc wins over the deprecated gauge; rank 1 has only the old one
    assert loads == {0: RankLoad(0, 3, 0, 0.25), 1: RankLoad(1, 0, 2, 0.5)}
    assert vllm_rank_loads(METRICS)[0].running == 12  # both models summed
    with pytest.raises(ValueError, match="one engine"):
        single_rank_load(METRICS, 5, "m")
    one = 'vllm:num_requests_running{engine="0",model_name="m"} 4\n'
    assert single_rank_load(one, 5) == RankLoad(5, 4, 0, None)
    with pytest.raises(ValueError, match="line 2"):
        parse_prometheus("ok 1\nbroken{a=\"x} 1\n")
    with pytest.raises(ValueError, match="bad value"):
        parse_prometheus("x{} abc\n")


def test_sglang_loads() -> None:
    body = {"timestamp": "t", "loads": [
        {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 1, "token_usage": 0.5,
         "num_used_tokens": 100},
        {"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}
    assert sglang_rank_loads(body) == {1: RankLoad(1, 2, 1, 0.5, 100),
                                       0: RankLoad(0, 0, 0, None, None)}
    with pytest.raises(ValueError, match="dp_rank"):
        sglang_rank_loads({"loads": [{"num_running_reqs": 1}]})
    with pytest.raises(ValueError, match="loads"):
        sglang_rank_loads({})


def test_vllm_builders_round_trip_kv_params() -> None:
    user = {"model": "m", "prompt": "a b", "max_tokens": 9, "stream": True,
            "stream_options": {"include_usage": True}, "min_tokens": 2}
    body, headers = vllm_prefill_request(user, "rid-1")
    assert body["kv_transfer_params"] == dict(VLLM_PREFILL_KV_PARAMS)
    assert body["stream"] is False and body["max_tokens"] == 1
    assert "stream_options" not in body and "min_tokens" not in body
    assert headers == {"X-Request-Id": "rid-1"} and user["max_tokens"] == 9
    returned = {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": "e", "remote_block_ids": [1], "remote_host": "h",
                "remote_port": 1, "remote_request_id": "x"}
    dbody, dheaders = vllm_decode_request(user, returned, "rid-1", rank=3)
    assert dbody["kv_transfer_params"] == returned and dbody["max_tokens"] == 9
    assert dbody["stream_options"] == {"include_usage": True,
                                       "continuous_usage_stats": True}
    assert dheaders == {"X-Request-Id": "rid-1", "X-data-parallel-rank": "3"}
    with pytest.raises(ValueError, match="remote_host"):
        check_vllm_kv_params({**returned, "remote_host": None})
    with pytest.raises(ValueError, match="do_remote_prefill"):
        check_vllm_kv_params({**returned, "do_remote_prefill": False})
    with pytest.raises(ValueError, match="kv_producer"):
        check_vllm_kv_params(None)


def test_sglang_builders_and_rooms() -> None:
    rng = random.Random(0)
    rooms = {new_bootstrap_room(rng) for _ in range(100)}
    assert len(rooms) == 100 and all(0 <= r < 2**63 for r in rooms)
    b = Bootstrap("10.0.0.1", 8998, 42)
    user = {"prompt": "x", "max_tokens": 4, "stream": True}
    pre = sglang_prefill_request(user, b, "r")
    dec = sglang_decode_request(user, b, "r", rank=2)
    for body in (pre, dec):
        assert (body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]) == \
            ("10.0.0.1", 8998, 42)
        assert body["rid"] == "r"
    assert pre["stream"] is False and "routed_dp_rank" not in pre
    assert dec["routed_dp_rank"] == 2 and dec["stream_options"]["continuous_usage_stats"]
    with pytest.raises(ValueError, match="room"):
        Bootstrap("h", 1, 2**63)


def test_error_bodies_of_both_engines() -> None:
    vllm = {"error": {"message": "bad", "type": "BadRequestError", "param": "x", "code": 400}}
    sgl = {"object": "error", "message": "bad", "type": "Bad Request", "param": None,
           "code": 400}
    assert parse_error_body(vllm) == ErrorInfo("bad", "BadRequestError", 400, "x")
    assert parse_error_body(sgl) == ErrorInfo("bad", "Bad Request", 400, None)
    assert parse_error_body({"error": sgl}) == ErrorInfo("bad", "Bad Request", 400, None)
    assert parse_error_body({"error": "Unauthorized"}) == ErrorInfo("Unauthorized")
    assert parse_error_body({"detail": "Not Found"}) == ErrorInfo("Not Found")
    assert parse_error_body([1]) is None and parse_error_body({"x": 1}) is None
