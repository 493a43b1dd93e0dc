"""The ingress: an OpenAI-compatible HTTP API and a Python handle API over one graph.

HTTP (FastAPI, wrapped as a Serve deployment in :mod:`br_serve.serve.graph`):
``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE streaming ending in
``data: [DONE]``, or one JSON body; both with ``usage``), ``GET /v1/models``,
``GET /health``, ``GET /v1/br/state``. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``, unknown routes and wrong methods
included: 400 bad JSON, a body that is not ``application/json``, a bad or unsupported
field (named; see :mod:`br_serve.serve.openai_api`) or a prompt over the context limit
("maximum context length", as vLLM), 401 missing or wrong API key (every path but
``/health``), 404 unknown model or route, 405 wrong method, 429 pool full, 503 no
decode replica alive.

Handle API: :meth:`Ingress.generate_stream` (see its docstring).

The first ingress replica creates the scheduler and decode replica actors (named, in
the graph's namespace, owned by it: deleting the app removes them).
"""

# No "from __future__ import annotations": FastAPI must see real annotations (Request)
# after Serve rewrites the method signatures.

import contextvars
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from br_serve.serve import openai_api as oa
from br_serve.serve.config import parse_graph_config
from br_serve.serve.stopping import OutputFilter
from br_serve.serve.streams import GenerateError, Streamer, Token

log = logging.getLogger(__name__)

api = FastAPI(title="BalanceRoute", docs_url=None, redoc_url=None)


def actor_names(app_name: str, replicas: int) -> tuple[str, list[str]]:
    """Names of the scheduler actor and the decode replica actors of one app."""
    return f"{app_name}:scheduler", [f"{app_name}:decode:{g}" for g in range(replicas)]


def _error(status: int, message: str, type_: str, param: str | None = None,
           code: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(oa.error_body(message, type_, code, param), status_code=status,
                        headers=headers)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors (unknown path, wrong method) in OpenAI's shape, not FastAPI's."""
    what = f"{request.method} {request.url.path}"
    msg = {404: f"{what}: no such route",
           405: f"{what}: method not allowed"}.get(exc.status_code, f"{what}: {exc.detail}")
    return _error(exc.status_code, msg, "invalid_request_error",
                  code=_HTTP_CODES.get(exc.status_code), headers=exc.headers)


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _error(400, f"request: {exc.errors()}", "invalid_request_error")


def _is_json(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media == "application/json"


async def _apply_filter(gen: AsyncGenerator[Token, None],
                        filt: OutputFilter) -> AsyncGenerator[Token, None]:
    """``gen`` with stop strings, stop ids and echo applied; ends (closing ``gen``, which
    aborts the request on its replica) at the token that finishes the output."""
    try:
        async for tok in gen:
            if tok.error is not None:
                yield tok
                return
            text, finished, reason = filt.push(tok.token_id, tok.text, tok.finished,
                                               tok.finish_reason)
            yield dataclasses.replace(tok, text=text, finished=finished,
                                      finish_reason=reason)
            if finished:
                return
    finally:
        await gen.aclose()


def _create_actors(config: dict[str, Any]) -> tuple[Any, list[Any], Any]:
    """Create (or find) the scheduler and decode actors; returns their handles.

    Handles come from the creation calls: named-actor registration is asynchronous, so
    looking them up by name right away could fail.
    """
    import ray

    from br_serve.serve.decode import DecodeReplica
    from br_serve.serve.kvkeeper import KVKeeper, keeper_name
    from br_serve.serve.scheduler import Scheduler

    cfg = parse_graph_config(config)
    sched_name, decode_names = actor_names(cfg.app_name, cfg.replicas)
    keeper = ray.remote(KVKeeper).options(
        name=keeper_name(cfg.app_name), namespace=cfg.namespace, get_if_exists=True,
        num_cpus=0, max_concurrency=1000).remote()
    decode = [
        ray.remote(DecodeReplica).options(
            name=name, namespace=cfg.namespace, get_if_exists=True, max_restarts=0,
            max_concurrency=1000, **cfg.replica_actor_options()).remote(g, config, sched_name)
        for g, name in enumerate(decode_names)]
    sched = ray.remote(Scheduler).options(
        name=sched_name, namespace=cfg.namespace, get_if_exists=True, num_cpus=0,
        max_restarts=-1, max_task_retries=0, max_concurrency=1000,
    ).remote(config, decode_names)
    return sched, decode, keeper


def _token_dict(tok: Token) -> dict[str, Any]:
    d = {"index": tok.index, "token_id": tok.token_id, "text": tok.text,
         "finished": tok.finished, "finish_reason": tok.finish_reason,
         "prompt_tokens": tok.prompt_tokens, "replica": tok.replica}
    if tok.error is not None:
        d["error"] = tok.error
    return d


# The FastAPI wrapping must happen at import time: Serve replicas import this module
# and pickle ``api`` by reference, so a wrapper applied elsewhere would not exist there.
@serve.ingress(api)
class Ingress:
    """OpenAI-compatible ingress (a Serve deployment built by :mod:`br_serve.serve.graph`)."""

    def __init__(self, prefill: Any, config: dict[str, Any]) -> None:
        self.cfg = parse_graph_config(config)
        self.api_key = self.cfg.resolved_api_key()
        sched, decode, keeper = _create_actors(self.cfg.model_dump())
        self.streamer = Streamer(self.cfg, prefill, sched, decode, keeper)
        self._metrics: Any = None
        try:
            from br_serve.serve.metrics import IngressMetrics

            self._metrics = IngressMetrics()
        except Exception as exc:
            log.warning("ingress: metrics disabled: %s", exc)

    # -- handle API ---------------------------------------------------------------------
    async def generate_stream(self, prompt: str | list[int], max_tokens: int = 16,
                              seed: int | None = None, temperature: float = 0.0,
                              request_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Stream one request's tokens as dicts.

        Each item: ``{"index", "token_id", "text", "finished", "finish_reason",
        "prompt_tokens", "replica"}``; the last has ``finished=True``. A failure yields
        one final item with ``"error"`` (and ``finish_reason == "error"``) instead.
        Call it as ``handle.options(stream=True).generate_stream.remote(...)``.
        """
        from br_serve.engine.base import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
        self._start()
        try:
            async for tok in self._timed(self.streamer.generate(prompt, params, request_id)):
                yield _token_dict(tok)
        except GenerateError as exc:
            yield {"index": 0, "finished": True, "finish_reason": "error",
                   "error": exc.message, "status": exc.status}

    def _start(self) -> None:
        """Start the streamer's background loops (idempotent) in a fresh context.

        Ray keeps an async actor's current task id in a context variable, and a task
        created with ``create_task`` copies the caller's context: loops started inside a
        request would submit their poll RPCs as children of that request, and when its
        client disconnects, Serve's recursive cancellation cancels them (the ingress
        then took every decode replica for dead and logged a TaskCancelledError per
        replica). An empty context makes them nobody's children.
        """
        contextvars.Context().run(self.streamer._ensure_started)

    async def state(self) -> dict[str, Any]:
        """The scheduler's view (same as ``GET /v1/br/state``)."""
        self._start()
        return await self.streamer._call_scheduler("state")  # type: ignore[no-any-return]

    async def stats(self) -> dict[str, Any]:
        self._start()
        return await self.streamer._call_scheduler("stats")  # type: ignore[no-any-return]

    async def reset_stats(self) -> None:
        self._start()
        await self.streamer._call_scheduler("reset_stats")

    # -- HTTP ---------------------------------------------------------------------------
    def _auth(self, request: Request) -> JSONResponse | None:
        if self.api_key is None:
            return None
        header = request.headers.get("authorization", "")
        if header != f"Bearer {self.api_key}":
            return _error(401, "missing or invalid API key", "invalid_request_error",
                          code="invalid_api_key")
        return None

    @api.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self, request: Request) -> Any:
        if (denied := self._auth(request)) is not None:
            return denied
        return {"object": "list", "data": [{"id": self.cfg.model, "object": "model",
                                            "created": 0, "owned_by": "br-serve"}]}

    @api.get("/v1/br/state")
    async def br_state(self, request: Request) -> Any:
        if (denied := self._auth(request)) is not None:
            return denied
        return await self.state()

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Any:
        return await self._serve(request, chat=False)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Any:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, chat: bool) -> Any:
        if (denied := self._auth(request)) is not None:
            return denied
        if not _is_json(request):  # as vLLM: only application/json bodies
            got = request.headers.get("content-type", "none")
            return _error(400, f"body: Content-Type must be application/json (got {got!r})",
                          "invalid_request_error")
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"body: invalid JSON ({exc})", "invalid_request_error")
        try:
            req = oa.parse_request(data, chat)
        except oa.RequestError as exc:
            return _error(400, exc.message, "invalid_request_error", exc.param)
        if req.model is not None and req.model != self.cfg.model:
            return _error(404, f"model: {req.model!r} does not exist; serving "
                          f"{self.cfg.model!r}", "invalid_request_error", "model",
                          "model_not_found")
        prompt = req.prompt_value()
        params = req.sampling()
        filt = req.output_filter()
        rid = self.streamer.new_request_id()
        public_id = ("chatcmpl-" if chat else "cmpl-") + (req.request_id or rid)
        self._start()
        raw = self.streamer.generate(prompt, params, rid)
        gen = self._timed(_apply_filter(raw, filt) if filt.active else raw)
        try:
            first = await gen.__anext__()
        except GenerateError as exc:
            param = exc.param
            if param is None and exc.status == 400 and exc.message.startswith("prompt:"):
                param = "prompt"
            return _error(exc.status, exc.message, exc.type, param)
        except StopAsyncIteration:
            return _error(500, "empty generation", "server_error")
        if req.stream:
            include, continuous = req.stream_usage()
            return StreamingResponse(
                self._sse(first, gen, public_id, chat, include, continuous, filt),
                media_type="text/event-stream")
        toks = [first]
        async for tok in gen:
            toks.append(tok)
        last = toks[-1]
        if last.error is not None:
            return _error(500, last.error, "server_error")
        text = "".join(t.text for t in toks)
        use = oa.usage(first.prompt_tokens, len(toks))
        return oa.completion_body(public_id, self.cfg.model, text, last.finish_reason, use,
                                  chat, filt.stop_reason)

    async def _sse(self, first: Token, gen: AsyncGenerator[Token, None], rid: str, chat: bool,
                   include_usage: bool, continuous_usage: bool = False,
                   filt: OutputFilter | None = None) -> AsyncIterator[str]:
        model = self.cfg.model
        n = 0
        tok: Token | None = first
        is_first = True
        try:
            while tok is not None:
                if tok.error is not None:
                    err = oa.error_body(tok.error, "server_error")
                    yield f"data: {json.dumps(err)}\n\n"
                    break
                n += 1
                use = (oa.usage(tok.prompt_tokens, n) if tok.finished or continuous_usage
                       else None)
                stop_reason = filt.stop_reason if filt is not None and tok.finished else None
                body = oa.chunk_body(rid, model, tok.text, tok.finish_reason if tok.finished
                                     else None, chat, first=is_first, use=use,
                                     stop_reason=stop_reason)
                is_first = False
                yield f"data: {json.dumps(body)}\n\n"
                if tok.finished:
                    if include_usage:
                        body = oa.chunk_body(rid, model, None, None, chat,
                                             use=oa.usage(tok.prompt_tokens, n),
                                             empty_choices=True)
                        yield f"data: {json.dumps(body)}\n\n"
                    break
                tok = await anext(gen, None)
            yield "data: [DONE]\n\n"
        finally:
            await gen.aclose()

    async def _timed(self, gen: AsyncIterator[Token]) -> AsyncGenerator[Token, None]:
        """Record TTFT and TPOT of one stream."""
        t0 = time.perf_counter()
        t_first = 0.0
        n = 0
        async for tok in gen:
            n += 1
            if n == 1:
                t_first = time.perf_counter()
                if self._metrics is not None:
                    self._metrics.ttft_ms.observe((t_first - t0) * 1e3)
            if tok.finished and n > 1 and self._metrics is not None:
                self._metrics.tpot_ms.observe((time.perf_counter() - t_first) * 1e3 / (n - 1))
            yield tok

