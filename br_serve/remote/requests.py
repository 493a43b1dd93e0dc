"""Request builders for the prefill and decode calls of a PD deployment (pure).

Each builder takes the client's OpenAI body (completions or chat, unchanged) and
returns a new body plus headers for one engine call; none mutates its input.

vLLM / vllm-ascend (KV connector: MooncakeConnectorV1, NixlConnector, ...):
    1. prefill: :func:`vllm_prefill_request` sets ``kv_transfer_params`` to
       :data:`VLLM_PREFILL_KV_PARAMS`, ``stream: false``, ``max_tokens: 1`` and drops
       ``stream_options`` / ``min_tokens`` (what vLLM's and vllm-ascend's proxies do);
    2. the prefill's answer carries ``kv_transfer_params`` (see
       :func:`check_vllm_kv_params`), which the decode call must carry back verbatim;
    3. decode: :func:`vllm_decode_request`, streamed with usage on every chunk, pinned
       with the ``X-data-parallel-rank`` header (one server for all ranks) or sent to
       the rank's own server.

SGLang (``--disaggregation-mode``): the router picks a ``bootstrap_room``
(:func:`new_bootstrap_room`) and sends :func:`sglang_prefill_request` and
:func:`sglang_decode_request` at the same time; the decode is pinned with
``routed_dp_rank`` in the body. The prefill's answer arrives once the KV moved.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
VLLM_RANK_HEADER = "X-data-parallel-rank"
REQUEST_ID_HEADER = "X-Request-Id"

#: What a vLLM prefill request carries (the decode side fills the rest).
VLLM_PREFILL_KV_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None}

#: The fields a vLLM prefill answer's ``kv_transfer_params`` must have for a decode.
VLLM_DECODE_KV_FIELDS = ("remote_engine_id", "remote_block_ids", "remote_host",
                         "remote_port")

#: Usage on every chunk: exact per-chunk token counts for the stream parser.
STREAM_OPTIONS: Mapping[str, bool] = {"include_usage": True, "continuous_usage_stats": True}

#: Seconds an idle pooled connection to an engine is reused, by default: below the
#: engines' server keep-alive of 5 s (see :class:`br_serve.remote.client.Timeouts`)
KEEPALIVE_S = 2.0


def bearer(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header of an engine's ``--api-key`` (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def endpoint_path(chat: bool) -> str:
    return CHAT_PATH if chat else COMPLETIONS_PATH


def _headers(request_id: str, rank: int | None) -> dict[str, str]:
    headers = {REQUEST_ID_HEADER: request_id}
    if rank is not None:
        if rank < 0:
            raise ValueError(f"rank: must be >= 0 (got {rank})")
        headers[VLLM_RANK_HEADER] = str(rank)
    return headers


def vllm_prefill_request(body: Mapping[str, Any], request_id: str,
                         rank: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(body, headers)`` of the prefill call (``rank``: the prefill DP rank, if any)."""
    out = dict(body)
    out["kv_transfer_params"] = dict(VLLM_PREFILL_KV_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(key, None)
    return out, _headers(request_id, rank)


def check_vllm_kv_params(params: Any) -> dict[str, Any]:
    """Validate a prefill answer's ``kv_transfer_params`` for the decode call.

    Raises:
        ValueError: naming the missing or wrong field.
    """
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params: the prefill answer has none (is the prefill "
                         "server started with a kv_producer --kv-transfer-config?)")
    if params.get("do_remote_prefill") is not True:
        raise ValueError("kv_transfer_params.do_remote_prefill: must be true in a prefill "
                         f"answer (got {params.get('do_remote_prefill')!r})")
    for name in VLLM_DECODE_KV_FIELDS:
        if params.get(name) is None:
            raise ValueError(f"kv_transfer_params.{name}: missing in the prefill answer")
    return dict(params)


def vllm_decode_request(body: Mapping[str, Any],
                        kv_transfer_params: Mapping[str, Any] | None,
                        request_id: str, rank: int | None = None,
                        stream: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """``(body, headers)`` of the decode call carrying the prefill's parameters
    (``None``: a prompt-keyed connector; the call is the same prompt without them).

    ``rank``: pin to this DP rank with ``X-data-parallel-rank`` (``None`` when the
    server runs one rank, or to let vLLM's balancer choose).
    """
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = check_vllm_kv_params(dict(kv_transfer_params))
    else:  # a prompt-keyed connector: the same prompt finds the KV
        out.pop("kv_transfer_params", None)
    out["stream"] = stream
    if stream:
        out["stream_options"] = dict(STREAM_OPTIONS)
    else:
        out.pop("stream_options", None)
    return out, _headers(request_id, rank)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Where an SGLang decode meets its prefill: the prefill's bootstrap address + room."""

    host: str
    port: int
    room: int

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("bootstrap host: must not be empty")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"bootstrap port: must be in 1..65535 (got {self.port})")
        if not 0 <= self.room < 2**63:
            raise ValueError(f"bootstrap room: must be in [0, 2**63) (got {self.room})")

    def fields(self) -> dict[str, Any]:
        return {"bootstrap_host": self.host, "bootstrap_port": self.port,
                "bootstrap_room": self.room}


def new_bootstrap_room(rng: random.Random) -> int:
    """A room id as SGLang's router draws it: uniform in ``[0, 2**63)``."""
    return rng.randrange(2**63)


def sglang_prefill_request(body: Mapping[str, Any], bootstrap: Bootstrap, request_id: str,
                           rank: int | None = None) -> dict[str, Any]:
    """Body of the prefill call (not streamed; ``rank``: the prefill's DP rank)."""
    out = dict(body)
    out.update(bootstrap.fields())
    out["rid"] = request_id
    out["stream"] = False
    out.pop("stream_options", None)
    if rank is not None:
        out["routed_dp_rank"] = rank
    return out


def sglang_decode_request(body: Mapping[str, Any], bootstrap: Bootstrap, request_id: str,
                          rank: int | None = None, stream: bool = True) -> dict[str, Any]:
    """Body of the decode call, pinned to ``rank`` with ``routed_dp_rank``."""
    out = dict(body)
    out.update(bootstrap.fields())
    out["rid"] = request_id
    out["stream"] = stream
    if stream:
        out["stream_options"] = dict(STREAM_OPTIONS)
    else:
        out.pop("stream_options", None)
    if rank is not None:
        if rank < 0:
            raise ValueError(f"rank: must be >= 0 (got {rank})")
        out["routed_dp_rank"] = rank
    return out
