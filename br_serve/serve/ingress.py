"""The ingress: an OpenAI-compatible HTTP API and a Python handle API over one graph.

HTTP (FastAPI, wrapped as a Serve deployment in :mod:`br_serve.serve.graph`):
``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE streaming ending in
``data: [DONE]``, or one JSON body; both with ``usage``), ``GET /v1/models``,
``GET /health`` (liveness: the ingress process answers), ``GET /ready`` (readiness: a
request would be served now; 503 otherwise), ``GET /v1/br/state``. Errors use OpenAI's
shape ``{"error": {"message", "type", "param", "code"}}``: 400 bad JSON/fields, 401
missing or wrong API key (every path but ``/health`` and ``/ready``), 404 unknown model,
413 prompt over the context limit, 429 the graph is at capacity (refused before any
prefill work, with ``Retry-After``), 503 no decode replica alive.

Handle API: :meth:`Ingress.generate_stream` (see its docstring).

The first ingress replica creates the scheduler, decode replica and KV keeper actors
(named, in the graph's namespace, owned by it: deleting the app removes them; see
:mod:`br_serve.serve.actors`). Its constructor returns only when the graph would serve
a request (the scheduler has formed the barrier group, and one warm-up request went
through prefill, the pool, a decode replica and back), so Serve, and ``serve run``,
report the app ready only then.
"""

# No "from __future__ import annotations": FastAPI must see real annotations (Request)
# after Serve rewrites the method signatures.

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from ray import serve

from br_serve.serve import openai_api as oa
from br_serve.serve.actors import create_actors, replace_decode
from br_serve.serve.config import parse_graph_config
from br_serve.serve.streams import GenerateError, Streamer, Token
from br_serve.transport.lease import KVLease

log = logging.getLogger(__name__)

api = FastAPI(title="BalanceRoute", docs_url=None, redoc_url=None)

#: bound on the constructor's wait for a ready graph (replica start-up included)
READY_WAIT_S = 300.0


def _error(status: int, message: str, type_: str, param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(oa.error_body(message, type_, code, param), status_code=status,
                        headers=headers)


def _generate_error(exc: GenerateError) -> JSONResponse:
    headers = ({"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None
               else None)
    return _error(exc.status, exc.message, exc.type, exc.param, headers=headers)


class _ChunkTemplate:
    """The SSE event of a middle token (neither the first nor the last) of one stream:
    ``oa.chunk_body``'s JSON with the text spliced in, the same bytes as
    ``json.dumps(oa.chunk_body(...))``, without building and encoding a dict per token
    (remade when ``created``, a whole second, changes)."""

    _MARK = r"\u0000"  # how json.dumps writes the placeholder text "\0"

    def __init__(self, rid: str, model: str, chat: bool) -> None:
        self.rid, self.model, self.chat = rid, model, chat
        self._second = -1
        self._head = self._tail = ""

    def event(self, text: str) -> str:
        if int(time.time()) != self._second:
            body = oa.chunk_body(self.rid, self.model, "\0", None, self.chat)
            self._second = int(body["created"])
            self._head, found, self._tail = json.dumps(body).partition(f'"{self._MARK}"')
            if not found:  # a body shape without the text as one JSON string
                self._second = -1
                body = oa.chunk_body(self.rid, self.model, text, None, self.chat)
                return f"data: {json.dumps(body)}\n\n"
        return f"data: {self._head}{json.dumps(text)}{self._tail}\n\n"


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

    # Serve awaits an async constructor (the replica is ready only when it returns)
    async def __init__(self, prefill: Any, config: dict[str, Any]) -> None:  # type: ignore[misc]
        self.cfg = parse_graph_config(config)
        self.api_key = self.cfg.resolved_api_key()
        actors = await create_actors(self.cfg)
        cfg = self.cfg

        async def replace(g: int, old: Any) -> Any:
            return await replace_decode(cfg, g, old)

        self.streamer = Streamer(self.cfg, prefill, actors.scheduler, actors.decode,
                                 KVLease(None, keeper=actors.keeper), replace)
        self._metrics: Any = None
        try:
            from br_serve.serve.metrics import IngressMetrics

            self._metrics = IngressMetrics()
        except (ImportError, RuntimeError, ValueError) as exc:
            log.warning("ingress: metrics disabled: %s", exc)
        await self._warm_up()

    async def _warm_up(self) -> None:
        """Wait (bounded) until a request would be served, then serve one end to end,
        so that the first user request meets warm code paths."""
        import asyncio

        from br_serve.engine.base import SamplingParams

        self.streamer._ensure_started()
        deadline = time.monotonic() + READY_WAIT_S
        params = SamplingParams(max_tokens=2, seed=0)
        attempt = 0
        while True:
            if await self._ready_now():
                attempt += 1
                rid = f"{self.streamer.owner}-warmup{attempt}"
                try:
                    toks = [t async for t in self.streamer.generate("warm up", params, rid)]
                    if toks and toks[-1].error is None:
                        return
                    log.warning("ingress: warm-up failed: %s", toks[-1:] or "no tokens")
                except GenerateError as exc:
                    log.warning("ingress: warm-up failed: %s", exc.message)
            if time.monotonic() > deadline:
                raise RuntimeError(f"ingress: graph not ready after {READY_WAIT_S:.0f} s")
            await asyncio.sleep(0.5)

    async def _ready_now(self) -> bool:
        """Readiness: the scheduler is up with a barrier group, and the graph has room."""
        try:
            ready = bool(await self.streamer._call_scheduler("ready"))
        except GenerateError:
            return False
        gate = self.streamer.gate
        return ready and max(gate.inside, gate.elsewhere) < gate.capacity()

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
        try:
            async for batch in self._timed(self.streamer.generate_batches(prompt, params,
                                                                          request_id)):
                for tok in batch:
                    yield _token_dict(tok)
        except GenerateError as exc:
            item = {"index": 0, "finished": True, "finish_reason": "error",
                    "error": exc.message, "status": exc.status}
            if exc.retry_after_s is not None:
                item["retry_after_s"] = exc.retry_after_s
            yield item

    async def state(self) -> dict[str, Any]:
        """The scheduler's view (same as ``GET /v1/br/state``)."""
        self.streamer._ensure_started()
        return await self.streamer._call_scheduler("state")  # type: ignore[no-any-return]

    async def stats(self) -> dict[str, Any]:
        self.streamer._ensure_started()
        return await self.streamer._call_scheduler("stats")  # type: ignore[no-any-return]

    async def reset_stats(self) -> None:
        self.streamer._ensure_started()
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
        """Liveness: this process answers (it says nothing about the graph)."""
        return {"status": "ok"}

    @api.get("/ready")
    async def ready(self) -> Any:
        """Readiness: 200 when a request would be served now, else 503."""
        if await self._ready_now():
            return {"status": "ready"}
        return _error(503, "not ready: the graph is starting, recovering or full",
                      "service_unavailable")

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
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"body: invalid JSON ({exc})", "invalid_request_error")
        if not isinstance(data, dict):
            return _error(400, "body: must be a JSON object", "invalid_request_error")
        try:
            req: oa.CompletionRequest | oa.ChatRequest = (
                oa.ChatRequest.model_validate(data) if chat
                else oa.CompletionRequest.model_validate(data))
            prompt = req.prompt_value()
        except ValidationError as exc:
            msg, param = oa.validation_message(exc)
            return _error(400, msg, "invalid_request_error", param)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error", "prompt")
        if req.model != self.cfg.model:
            return _error(404, f"model: {req.model!r} does not exist; serving "
                          f"{self.cfg.model!r}", "invalid_request_error", "model",
                          "model_not_found")
        params = req.sampling()
        rid = self.streamer.new_request_id()
        public_id = ("chatcmpl-" if chat else "cmpl-") + rid
        gen = self._timed(self.streamer.generate_batches(prompt, params, rid))
        try:
            first = await gen.__anext__()
        except GenerateError as exc:
            return _generate_error(exc)
        except StopAsyncIteration:
            return _error(500, "empty generation", "server_error")
        if req.stream:
            include = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._sse(first, gen, public_id, chat, include),
                media_type="text/event-stream")
        toks = list(first)
        async for batch in gen:
            toks.extend(batch)
        last = toks[-1]
        if last.error is not None:
            return _error(500, last.error, "server_error")
        text = "".join(t.text for t in toks)
        use = oa.usage(toks[0].prompt_tokens, len(toks))
        return oa.completion_body(public_id, self.cfg.model, text, last.finish_reason, use,
                                  chat)

    async def _sse(self, first: list[Token], gen: AsyncGenerator[list[Token], None],
                   rid: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        """SSE events of one stream: one chunk per token (OpenAI's shape), written
        together when they arrived together (fewer writes through Serve's proxy, the
        same bytes)."""
        model = self.cfg.model
        n = 0
        batch: list[Token] | None = first
        is_first = True
        middle = _ChunkTemplate(rid, model, chat)
        try:
            while batch is not None:
                out: list[str] = []
                done = False
                for tok in batch:
                    if tok.error is not None:
                        err = oa.error_body(tok.error, "server_error")
                        out.append(f"data: {json.dumps(err)}\n\n")
                        done = True
                        break
                    n += 1
                    if not (is_first or tok.finished):
                        out.append(middle.event(tok.text))
                        continue
                    use = oa.usage(tok.prompt_tokens, n) if tok.finished else None
                    body = oa.chunk_body(rid, model, tok.text, tok.finish_reason
                                         if tok.finished else None, chat, first=is_first,
                                         use=use)
                    is_first = False
                    out.append(f"data: {json.dumps(body)}\n\n")
                    if tok.finished:
                        if include_usage:
                            body = oa.chunk_body(rid, model, None, None, chat,
                                                 use=oa.usage(tok.prompt_tokens, n),
                                                 empty_choices=True)
                            out.append(f"data: {json.dumps(body)}\n\n")
                        done = True
                        break
                if done:
                    out.append("data: [DONE]\n\n")
                yield "".join(out)
                if done:
                    return
                batch = await anext(gen, None)
            yield "data: [DONE]\n\n"
        finally:
            await gen.aclose()

    async def _timed(self, gen: AsyncIterator[list[Token]]
                     ) -> AsyncGenerator[list[Token], None]:
        """Record TTFT and TPOT of one stream (batches pass through unchanged)."""
        t0 = time.perf_counter()
        t_first = 0.0
        n = 0
        async for batch in gen:
            if n == 0:
                t_first = time.perf_counter()
                if self._metrics is not None:
                    self._metrics.ttft_ms.observe((t_first - t0) * 1e3)
            n += len(batch)
            if batch[-1].finished and n > 1 and self._metrics is not None:
                self._metrics.tpot_ms.observe((time.perf_counter() - t_first) * 1e3 / (n - 1))
            yield batch

