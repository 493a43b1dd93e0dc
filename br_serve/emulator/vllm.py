"""The vLLM / vllm-ascend protocol: an OpenAI server with a PD KV connector.

Follows docs/engine-contracts.md ("vLLM"):

- ``POST /v1/completions``, ``POST /v1/chat/completions``; errors as
  ``{"error": {"message", "type", "param", "code": <HTTP status>}}``; in a stream an
  error is one ``data: {"error": ...}`` event followed by ``data: [DONE]``.
- Prefill role (``kv_producer``): a prefill request carries ``kv_transfer_params`` with
  ``do_remote_decode: true``, ``stream: false`` and ``max_tokens`` (or
  ``max_completion_tokens``) 1 (other parameters are refused, 400); a request with no
  ``kv_transfer_params`` is served in full (prefilled and decoded here), as a
  ``kv_producer`` vLLM serves it. The response is a normal completion of one token plus
  ``kv_transfer_params = {do_remote_prefill: true, do_remote_decode: false,
  remote_engine_id, remote_request_id, remote_block_ids, remote_host, remote_port,
  tp_size, last_token_id, num_prompt_blocks, remote_block_size}``. The prefill then
  holds the KV until a decode pulls it, ``POST /v1/requests/{id}/cancel`` aborts it, or
  ``kv_ttl_s`` passes.
- Decode role (``kv_consumer``): the request must carry those parameters back; the
  emulator pulls the KV from ``remote_host:remote_port`` (the prefill emulator's HTTP
  port: the stand-in for the connector's side channel) and refuses (400) parameters
  the prefill never issued. A decode refused for another reason still frees the
  prefill's KV (vllm-ascend's connector sends its "done" signal on rejection too).
  The stream carries all ``max_tokens`` tokens; token 0 equals the prefill's token.
  A request with no ``kv_transfer_params`` at all is prefilled locally and decoded, as a
  ``kv_consumer`` vLLM serves it.
- Context length: ``prompt + max_tokens`` over ``kv_limit_tokens`` (the
  ``max_model_len`` that ``/v1/models`` reports) is refused with vLLM's 400 messages.
- Rank pinning: the ``X-data-parallel-rank`` header on a single server for all ranks
  (no header: vLLM's DP balancer, least ``4 * waiting + running``), or one server per
  rank (``port_per_rank``; a header naming another rank is refused).
- Prompt-keyed connector (``kv_store_dir``, the stand-in for vLLM's ExampleConnector
  on a shared directory; also LMCache, store-based Mooncake): a prefill stores a file
  keyed by the model and prompt and answers ``"kv_transfer_params": null``; a decode
  request without transfer parameters loads that file if it is there (``kv_pulls``)
  or recomputes (``kv_recomputes``, as the connector does on a miss). Files are never
  deleted (as ExampleConnector). Without ``kv_store_dir`` both requests need the
  parameters, as above.
- ``GET /version`` (smg's runtime probe); unknown request fields are accepted, logged at
  debug level and counted, as vLLM's request models do (``--strict-fields`` refuses).
- ``GET /metrics``: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (and the deprecated ``vllm:gpu_cache_usage_perc``),
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, labelled
  ``engine="<rank>"`` and ``model_name``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from br_serve.emulator.app import (
    Emulator,
    Spec,
    add_completion_routes,
    build_base_app,
)
from br_serve.emulator.config import EmulatorConfig
from br_serve.emulator.core import first_token
from br_serve.emulator.openai import (
    ApiError,
    ParsedRequest,
    completion_body,
    sse_json,
)
from br_serve.emulator.vllm_wire import VllmChunkWriter, vllm_body

RANK_HEADER = "X-data-parallel-rank"
#: what ``GET /version`` answers (vLLM answers its release; routers only probe it)
VERSION = "0.0.0+emulated"
_REQUIRED = ("remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host",
             "remote_port")
_EXTRA = frozenset({"kv_transfer_params"})


def prompt_key(body: dict[str, Any], model: str) -> str:
    """The file name a prompt-keyed connector stores a prompt's KV under."""
    prompt = body.get("messages") if "messages" in body else body.get("prompt")
    raw = json.dumps([model, prompt], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest() + ".kv"


def error_body(exc: ApiError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.type, "param": exc.param,
                      "code": exc.status}}


def stream_error(exc: ApiError) -> bytes:
    return sse_json(error_body(exc)) + b"data: [DONE]\n\n"


SPEC = Spec("vllm", error_body, stream_error, {"stop_reason": None},
            writer=VllmChunkWriter, shape_body=vllm_body)


def check_context(req: ParsedRequest, max_model_len: int) -> None:
    """vLLM's length checks: the prompt, then prompt + ``max_tokens``, within
    ``max_model_len`` (400 before any token; a stream never starts)."""
    n, name = req.prompt_tokens, "max_completion_tokens" if req.chat else "max_tokens"
    if n >= max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. "
                            f"However, your request has {n} input tokens. Please reduce the "
                            "length of the input messages.", "input_tokens")
    if n + req.max_tokens > max_model_len:
        raise ApiError(400, f"'{name}' is too large: {req.max_tokens}. This model's maximum "
                            f"context length is {max_model_len} tokens and your request has "
                            f"{n} input tokens ({req.max_tokens} > {max_model_len} - {n}).",
                       name)


def make_emulator(config: EmulatorConfig) -> Emulator:
    return Emulator(config, SPEC)


def build_app(emu: Emulator, rank: int | None = None) -> FastAPI:
    """One vLLM API server; ``rank`` fixed for external DP (``port_per_rank``)."""
    app = build_base_app(emu, rank)
    cfg = emu.config
    blocks = itertools.count()

    def pinned_rank(request: Request) -> int:
        raw = request.headers.get(RANK_HEADER)
        if raw is None:
            return rank if rank is not None else emu.least_loaded_rank()
        try:
            g = int(raw)
        except ValueError:
            raise ApiError(400, f"{RANK_HEADER}: not an integer ({raw!r})",
                           RANK_HEADER) from None
        if rank is not None and g != rank:
            raise ApiError(400, f"{RANK_HEADER}: this server is data parallel rank {rank} "
                                f"(got {g})", RANK_HEADER)
        if not 0 <= g < cfg.dp_size:
            raise ApiError(400, f"data_parallel_rank {g} is out of range "
                                f"[0, {cfg.dp_size})", RANK_HEADER)
        return g

    def parse(body: dict[str, Any], chat: bool) -> ParsedRequest:
        """Validate as vLLM does, including the context length (``kv_limit_tokens``
        plays ``--max-model-len``, as ``/v1/models`` says)."""
        req = emu.parse(body, chat, _EXTRA, True)
        check_context(req, cfg.kv_limit_tokens)
        return req

    def external_id(request: Request, prefix: str) -> str:
        return request.headers.get("x-request-id") or emu.new_id(prefix)

    async def prefill(request: Request, body: dict[str, Any], chat: bool) -> Response:
        ktp = body.get("kv_transfer_params")
        store = cfg.kv_store_dir
        if ktp is None and store is None:  # a kv_producer vLLM serves a plain request
            return await local(request, body, chat)
        if store is None and (not isinstance(ktp, dict)
                              or ktp.get("do_remote_decode") is not True):
            raise ApiError(400, "kv_transfer_params: a prefill (kv_producer) request needs "
                                "do_remote_decode: true", "kv_transfer_params")
        req = parse(body, chat)
        if req.stream:
            raise ApiError(400, "stream: a prefill request must not stream", "stream")
        if req.max_tokens != 1:
            raise ApiError(400, "max_tokens: a prefill request generates exactly 1 token "
                                f"(got {req.max_tokens})", "max_tokens")
        g = pinned_rank(request)
        emu.check_rank_alive(g)
        ext = external_id(request, "cmpl")
        key = emu.new_id("prefill")
        await emu.run_prefill(request, g, req.prompt_tokens)
        if store is not None:
            tid, text = first_token(req.seed, req.prompt_tokens, cfg.vocab_size)
            with open(os.path.join(store, prompt_key(body, req.model)), "w") as f:
                f.write(f"{req.prompt_tokens}\n")
            emu.counters.prefills[g] += 1
            emu.counters.prefill_ids[g].append(ext)
            emu.counters.prompt_tokens[g] += req.prompt_tokens
            return JSONResponse(vllm_body(completion_body(
                f"{'chatcmpl' if chat else 'cmpl'}-{ext}", req, text, 1, SPEC.choice_extra,
                kv_transfer_params=None), req))
        n_blocks = math.ceil(req.prompt_tokens / cfg.block_size)
        block_ids = [next(blocks) for _ in range(n_blocks)]
        tid, text = first_token(req.seed, req.prompt_tokens, cfg.vocab_size)
        params = {"do_remote_prefill": True, "do_remote_decode": False,
                  "remote_engine_id": cfg.engine_id, "remote_request_id": key,
                  "remote_block_ids": block_ids, "remote_host": cfg.public_host,
                  "remote_port": cfg.port + (rank or 0), "tp_size": 1,
                  "last_token_id": tid, "num_prompt_blocks": n_blocks,
                  "remote_block_size": cfg.block_size}
        emu.broker.issue(key, {"remote_engine_id": cfg.engine_id, "remote_request_id": key,
                               "remote_block_ids": block_ids,
                               "prompt_tokens": req.prompt_tokens},
                         req.prompt_tokens, g)
        emu.counters.internal_id[ext] = key
        emu.counters.prefills[g] += 1
        emu.counters.prefill_ids[g].append(ext)
        emu.counters.prompt_tokens[g] += req.prompt_tokens
        prefix = "chatcmpl" if chat else "cmpl"
        return JSONResponse(vllm_body(completion_body(
            f"{prefix}-{ext}", req, text, 1, SPEC.choice_extra, kv_transfer_params=params),
            req))

    async def start_decode(request: Request, g: int, req: ParsedRequest,
                           chat: bool) -> Response:
        """Decode ``req`` on rank ``g`` under the client's id (a fresh internal id when that
        id is still running): the one tail of every decode path."""
        ext = external_id(request, "cmpl")
        rid = ext if emu.core.rank_of(ext) is None else emu.new_id(ext)
        emu.counters.internal_id[ext] = rid
        prefix = "chatcmpl" if chat else "cmpl"
        return await emu.decode_response(request, rid, f"{prefix}-{ext}", g, req)

    async def local(request: Request, body: dict[str, Any], chat: bool) -> Response:
        """A request without transfer parameters: prefilled here, then decoded (a
        kv_consumer vLLM serves these like any server)."""
        req = parse(body, chat)
        g = pinned_rank(request)
        emu.check_rank_alive(g)
        await emu.run_prefill(request, g, req.prompt_tokens)
        emu.counters.prompt_tokens[g] += req.prompt_tokens
        return await start_decode(request, g, req, chat)

    async def decode(request: Request, body: dict[str, Any], chat: bool) -> Response:
        ktp = body.get("kv_transfer_params")
        if ktp is None and cfg.kv_store_dir is not None:
            return await prompt_keyed_decode(request, body, chat)
        if ktp is None:
            return await local(request, body, chat)
        if not isinstance(ktp, dict) or ktp.get("do_remote_prefill") is not True:
            raise ApiError(400, "kv_transfer_params: a decode (kv_consumer) request needs "
                                "the prefill's parameters with do_remote_prefill: true",
                           "kv_transfer_params")
        for name in _REQUIRED:
            if ktp.get(name) is None:
                raise ApiError(400, f"kv_transfer_params.{name}: missing",
                               f"kv_transfer_params.{name}")
        host, port = str(ktp["remote_host"]), ktp["remote_port"]
        if not isinstance(port, int):
            raise ApiError(400, "kv_transfer_params.remote_port: must be an integer",
                           "kv_transfer_params.remote_port")
        key = str(ktp["remote_request_id"])
        try:
            req: ParsedRequest = parse(body, chat)
            g = pinned_rank(request)
            emu.check_rank_alive(g)
        except ApiError:
            await emu.release_at_twin(host, port, key)
            raise
        presented = {"remote_engine_id": ktp["remote_engine_id"], "remote_request_id": key,
                     "remote_block_ids": ktp["remote_block_ids"],
                     "prompt_tokens": req.prompt_tokens}
        await emu.pull_from_twin(host, port, key, presented, cfg.wait_s)
        emu.counters.kv_pulls[g] += 1
        emu.counters.prompt_tokens[g] += req.prompt_tokens
        return await start_decode(request, g, req, chat)

    async def prompt_keyed_decode(request: Request, body: dict[str, Any],
                                  chat: bool) -> Response:
        req: ParsedRequest = emu.parse(body, chat, _EXTRA, True)
        g = pinned_rank(request)
        emu.check_rank_alive(g)
        assert cfg.kv_store_dir is not None
        if os.path.exists(os.path.join(cfg.kv_store_dir, prompt_key(body, req.model))):
            emu.counters.kv_pulls[g] += 1
        else:  # the connector's miss: the decode server computes the prompt itself
            emu.counters.kv_recomputes[g] += 1
        emu.counters.prompt_tokens[g] += req.prompt_tokens
        return await start_decode(request, g, req, chat)

    add_completion_routes(app, cfg.role, prefill, decode)

    @app.post("/v1/requests/{request_id}/cancel")
    async def cancel(request_id: str) -> dict[str, str]:
        key = emu.counters.internal_id.get(request_id, request_id)
        done = emu.broker.abort(key) if cfg.role == "prefill" else emu.driver.cancel(key)
        if not done:
            raise ApiError(404, f"Request {request_id} not found or already completed.")
        return {"request_id": request_id}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(emu, rank),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


_GAUGES = (("vllm:num_requests_running", "Number of requests in model execution batches."),
           ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
           ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
           ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage. "
                                         "DEPRECATED: Use vllm:kv_cache_usage_perc instead."))
_COUNTERS = (("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
             ("vllm:generation_tokens_total", "Number of generation tokens processed."))


def metrics_text(emu: Emulator, rank: int | None) -> str:
    """The Prometheus exposition of the ranks this server owns (all, or ``rank``)."""
    cfg, core, c = emu.config, emu.core, emu.counters
    ranks = range(cfg.dp_size) if rank is None else [rank]
    cap = cfg.kv_limit_tokens
    values: dict[str, list[float]] = {}
    for g in ranks:
        if cfg.role == "decode":
            kv = core.load_tokens(g) / cap
            row = [core.running_count(g), core.waiting_count(g), kv, kv, c.prompt_tokens[g],
                   core.counters[g].tokens]
        else:
            held = emu.broker.ledger.held_tokens(g)
            row = [c.inflight_prefills[g], 0, held / cap, held / cap, c.prompt_tokens[g],
                   c.prefills[g]]
        for (name, _), v in zip((*_GAUGES, *_COUNTERS), row, strict=True):
            values.setdefault(name, []).append(float(v))
    lines: list[str] = []
    kinds = [("gauge", n, h) for n, h in _GAUGES] + [("counter", n, h) for n, h in _COUNTERS]
    for kind, name, help_ in kinds:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for g, v in zip(ranks, values[name], strict=True):
            lines.append(f'{name}{{engine="{g}",model_name="{cfg.model}"}} {v!r}')
    return "\n".join(lines) + "\n"
