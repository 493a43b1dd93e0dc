"""The SGLang protocol: an OpenAI server in ``--disaggregation-mode prefill|decode``.

Follows docs/engine-contracts.md ("SGLang"):

- ``POST /v1/completions``, ``POST /v1/chat/completions`` with the PD fields
  ``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room`` (an integer in
  ``[0, 2**63)`` the router picks), ``routed_dp_rank`` (deprecated alias
  ``data_parallel_rank``; the ``X-Data-Parallel-Rank`` header wins over both; none: the
  DP controller's default, ``follow_bootstrap_room`` (``room % dp_size``) on a prefill
  server and round robin on a decode server) and, on a decode, ``disagg_prefill_dp_rank``
  (the prefill rank holding the KV; none: ``room % prefill dp_size``, which the prefill
  side fills in as SGLang's bootstrap server does). A decode naming a rank other than
  the one holding the room is refused (400). Other fields are accepted and ignored
  (``--strict-fields`` refuses them). Errors are flat: ``{"object": "error", "message",
  "type", "param", "code"}``; in a stream ``data: {"error": {...}}`` then ``data: [DONE]``.
- The router sends the same request to the prefill and the decode server at once.
  Prefill role: computes the prompt, opens the room and holds its KV; its HTTP answer
  (one token) comes only when the room's KV was pulled. An abort
  (``POST /abort_request {"rid"}``, or the client leaving) or ``kv_ttl_s`` without a
  decode (SGLang's bootstrap timeout) releases the KV and answers with an error.
- Decode role: waits up to ``bootstrap_wait_s`` for the room at
  ``bootstrap_host:bootstrap_port`` (the prefill emulator's HTTP or bootstrap port),
  refuses (400) a room the prefill never opened, then decodes all ``max_tokens``
  tokens in lock-step (token 0 equals the prefill's token).
- ``GET /v1/loads``: per-rank ``num_running_reqs``, ``num_waiting_reqs``,
  ``num_used_tokens``, ``max_total_num_tokens``, ``token_usage``, ``gen_throughput``
  (tokens/s over the rank's last 40 steps), ... (``dp_rank`` / ``include`` / ``format``
  query parameters), in the shape smg parses (integers where it reads ``i32``).
- ``GET /server_info`` and ``/get_server_info`` (``dp_size``, ``model_path``,
  ``served_model_name``, ``disaggregation_mode``, ``max_running_requests``, ... : what
  sglang-router / smg's ``--dp-aware`` worker workflow reads), ``GET /model_info`` and
  ``/get_model_info``.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from br_serve.emulator.app import (
    Emulator,
    Spec,
    TokenStream,
    add_completion_routes,
    build_base_app,
    json_body,
    unless_disconnected,
)
from br_serve.emulator.config import EmulatorConfig
from br_serve.emulator.core import first_token
from br_serve.emulator.openai import (
    DONE,
    ApiError,
    ChunkWriter,
    ParsedRequest,
    completion_body,
    sse_json,
)

RANK_HEADER = "X-Data-Parallel-Rank"
_EXTRA = frozenset({"bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank",
                    "data_parallel_rank", "disagg_prefill_dp_rank", "rid"})
_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
VERSION = "emulated"


def error_body(exc: ApiError) -> dict[str, Any]:
    return {"object": "error", "message": exc.message, "type": exc.type, "param": exc.param,
            "code": exc.status}


def stream_error(exc: ApiError) -> bytes:
    return sse_json({"error": error_body(exc)}) + DONE


def _pull_defaults(cfg: EmulatorConfig, key: str, presented: dict[str, Any]
                   ) -> dict[str, Any]:
    """A decode that did not name the prefill rank looks for ``room % dp_size``."""
    if presented.get("prefill_dp_rank") is None and key.isdigit():
        presented["prefill_dp_rank"] = int(key) % cfg.dp_size
    return presented


SPEC = Spec("sglang", error_body, stream_error, {"matched_stop": None}, _pull_defaults)


def make_emulator(config: EmulatorConfig) -> Emulator:
    return Emulator(config, SPEC)


def _int_field(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value < hi:
        raise ApiError(400, f"{name}: must be an integer in [{lo}, {hi})", name)
    return value


def build_app(emu: Emulator, rank: int | None = None) -> FastAPI:
    app = build_base_app(emu, rank)
    cfg = emu.config

    def pinned_rank(request: Request, body: dict[str, Any], room: int) -> int:
        raw = request.headers.get(RANK_HEADER)
        if raw is not None:
            try:
                g: int | None = int(raw)
            except ValueError:
                raise ApiError(400, f"{RANK_HEADER}: not an integer ({raw!r})",
                               RANK_HEADER) from None
        else:
            g = body.get("routed_dp_rank")
            if g is None:
                g = body.get("data_parallel_rank")
        if g is None:
            # SGLang's DP controller: follow_bootstrap_room on a prefill, round robin on
            # a decode
            return room % cfg.dp_size if cfg.role == "prefill" else emu.round_robin_rank()
        if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < cfg.dp_size:
            raise ApiError(400, f"routed_dp_rank={g!r} out of range [0, {cfg.dp_size})",
                           "routed_dp_rank")
        return g

    def bootstrap(body: dict[str, Any]) -> tuple[str, int, int]:
        room = _int_field(body, "bootstrap_room", 0, 2**63)
        if room is None:
            raise ApiError(400, "bootstrap_room: a disaggregated request needs the room "
                                "the router picked", "bootstrap_room")
        host = body.get("bootstrap_host")
        port = _int_field(body, "bootstrap_port", 1, 65536)
        if cfg.role == "decode" and (not isinstance(host, str) or port is None):
            raise ApiError(400, "bootstrap_host / bootstrap_port: the decode server needs "
                                "the prefill server's bootstrap address", "bootstrap_host")
        return str(host), port or 0, room

    async def prefill(request: Request, body: dict[str, Any], chat: bool) -> Response:
        _, _, room = bootstrap(body)
        req = emu.parse(body, chat, _EXTRA, False)
        g = pinned_rank(request, body, room)
        emu.check_rank_alive(g)
        rid = str(body.get("rid") or emu.new_id("cmpl"))
        key = str(room)
        if emu.broker.ledger.holds(key) or emu.broker.ledger.released_reason(key):
            raise ApiError(400, f"bootstrap_room: {room} is already in use", "bootstrap_room")
        emu.timeline.mark(key, "prefill_in", seed=req.seed)
        await emu.run_prefill(request, g, req.prompt_tokens)
        emu.timeline.mark(key, "prefill_done")
        emu.broker.issue(key, {"bootstrap_room": room, "prompt_tokens": req.prompt_tokens,
                               "prefill_dp_rank": g}, req.prompt_tokens, g)
        emu.counters.internal_id[rid] = key
        emu.counters.prefills[g] += 1
        emu.counters.prefill_ids[g].append(rid)
        emu.counters.prompt_tokens[g] += req.prompt_tokens
        try:
            reason = await unless_disconnected(request, emu.broker.wait_released(key))
        except ApiError:
            emu.broker.abort(key)  # the client left: SGLang aborts the request
            raise
        emu.timeline.mark(key, "kv_released")
        if reason == "expired":
            raise ApiError(500, f"bootstrap_room {room}: no decode server took the KV within "
                                f"{cfg.ttl_s:g} s (bootstrap timeout)")
        if reason == "aborted":
            raise ApiError(400, f"request {rid} was aborted", type_="AbortError")
        _, text = first_token(req.seed, req.prompt_tokens, cfg.vocab_size)
        return _one_token_answer(rid, req, text)

    async def decode(request: Request, body: dict[str, Any], chat: bool) -> Response:
        host, port, room = bootstrap(body)
        req: ParsedRequest = emu.parse(body, chat, _EXTRA, False)
        g = pinned_rank(request, body, room)
        emu.check_rank_alive(g)
        src = _int_field(body, "disagg_prefill_dp_rank", 0, 2**31)
        presented = {"bootstrap_room": room, "prompt_tokens": req.prompt_tokens,
                     "prefill_dp_rank": src}
        emu.timeline.mark(str(room), "decode_in", seed=req.seed, rank=g)
        await emu.pull_from_twin(host, port, str(room), presented, cfg.wait_s)
        emu.timeline.mark(str(room), "kv_ready")
        emu.counters.kv_pulls[g] += 1
        emu.counters.prompt_tokens[g] += req.prompt_tokens
        ext = str(body.get("rid") or emu.new_id("cmpl"))
        rid = ext if emu.core.rank_of(ext) is None else emu.new_id(ext)
        emu.counters.internal_id[ext] = rid
        return await emu.decode_response(request, rid, ext, g, req, mark_key=str(room))

    add_completion_routes(app, cfg.role, prefill, decode)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await json_body(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise ApiError(400, "rid: the id of the request to abort", "rid")
        key = emu.counters.internal_id.get(rid, rid)
        if cfg.role == "prefill":
            emu.broker.abort(key)
        else:
            emu.driver.cancel(key)
        return Response(status_code=200)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return server_info_body(emu)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": cfg.model, "tokenizer_path": cfg.model, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": "emulated", "architectures": ["EmulatedForCausalLM"]}

    @app.get("/v1/loads")
    async def loads(dp_rank: int | None = None, include: str | None = None,
                    format: str | None = None) -> Response:
        sections = {s.strip() for s in include.split(",")} if include else {"all"}
        bad = sections - _SECTIONS
        if bad:
            raise ApiError(400, f"Invalid include sections: {sorted(bad)}. "
                                f"Valid options: {sorted(_SECTIONS)}", "include")
        if dp_rank is not None and not 0 <= dp_rank < cfg.dp_size:
            raise ApiError(400, f"dp_rank: out of range [0, {cfg.dp_size})", "dp_rank")
        rows = [load_row(emu, g) for g in range(cfg.dp_size)
                if dp_rank is None or g == dp_rank]
        if format == "prometheus":
            lines = []
            for name in ("num_running_reqs", "num_waiting_reqs", "num_used_tokens",
                         "token_usage"):
                lines.append(f"# TYPE sglang_{name} gauge")
                lines += [f'sglang_{name}{{dp_rank="{r["dp_rank"]}"}} {r[name]}' for r in rows]
            return PlainTextResponse("\n".join(lines) + "\n")
        return JSONResponse({
            "timestamp": datetime.now(timezone.utc).isoformat(), "version": VERSION,
            "dp_rank_count": len(rows), "loads": rows, "aggregate": _aggregate(rows)})

    return app


def server_info_body(emu: Emulator) -> dict[str, Any]:
    """The part of SGLang's ``/server_info`` (its server arguments, the scheduler's info
    and the version) that routers read."""
    cfg = emu.config
    return {
        "model_path": cfg.model, "served_model_name": cfg.model, "tokenizer_path": cfg.model,
        "tp_size": 1, "dp_size": cfg.dp_size, "pp_size": 1,
        "enable_dp_attention": cfg.dp_size > 1,
        "load_balance_method": ("follow_bootstrap_room" if cfg.role == "prefill"
                                else "round_robin"),
        "disaggregation_mode": cfg.role,
        "disaggregation_bootstrap_port": cfg.bootstrap_port or cfg.port,
        # the server argument is the total over DP-attention ranks (each scheduler runs
        # max_running_requests // dp_size); /v1/loads reports the per-rank figure
        "max_running_requests": cfg.slots * cfg.dp_size,
        "max_total_num_tokens": cfg.kv_limit_tokens,
        "context_length": cfg.kv_limit_tokens, "is_embedding": False,
        "host": cfg.host, "port": cfg.port, "version": VERSION,
        "internal_states": [{"dp_rank": g, "max_running_requests": cfg.slots,
                             "max_total_num_tokens": cfg.kv_limit_tokens}
                            for g in range(cfg.dp_size)],
    }


def load_row(emu: Emulator, g: int) -> dict[str, Any]:
    cfg, core = emu.config, emu.core
    if cfg.role == "decode":
        running, waiting, used = core.running_count(g), core.waiting_count(g), \
            core.load_tokens(g)
        queued_tokens = used - core.running_load_tokens(g)
        throughput = emu.driver.log.gen_throughput(g)
    else:
        running, waiting = emu.counters.inflight_prefills[g], 0
        used, queued_tokens, throughput = emu.broker.ledger.held_tokens(g), 0, 0.0
    usage = used / cfg.kv_limit_tokens
    return {"dp_rank": g, "timestamp": time.time(), "num_running_reqs": running,
            "num_waiting_reqs": waiting, "num_total_reqs": running + waiting,
            "num_waiting_uncached_tokens": queued_tokens,
            "num_used_tokens": used, "num_total_tokens": used,
            "max_total_num_tokens": cfg.kv_limit_tokens, "token_usage": usage,
            "gen_throughput": throughput, "cache_hit_rate": 0.0, "utilization": usage,
            "max_running_requests": cfg.slots, "disagg_mode": cfg.role}


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = max(len(rows), 1)
    return {"total_running_reqs": sum(r["num_running_reqs"] for r in rows),
            "total_waiting_reqs": sum(r["num_waiting_reqs"] for r in rows),
            "total_reqs": sum(r["num_total_reqs"] for r in rows),
            "total_used_tokens": sum(r["num_used_tokens"] for r in rows),
            "avg_token_usage": sum(r["token_usage"] for r in rows) / n}


def _one_token_answer(rid: str, req: ParsedRequest, text: str) -> Response:
    if not req.stream:
        return JSONResponse(completion_body(rid, req, text, 1, SPEC.choice_extra))
    writer = ChunkWriter(rid, req, SPEC.choice_extra)

    async def frames() -> Any:
        head = writer.role()
        if head is not None:
            yield head
        yield writer.token(text, 1, True)
        tail = writer.final_usage(1)
        if tail is not None:
            yield tail
        yield DONE

    return TokenStream(frames(), lambda: None)
