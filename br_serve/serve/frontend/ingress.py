"""The ingress: an OpenAI-compatible HTTP API and a Python handle API over one graph.

HTTP (FastAPI, wrapped as a Serve deployment in :mod:`br_serve.serve.graph`):
``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE streaming ending in
``data: [DONE]``, or one JSON body; both with ``usage``), ``GET /v1/models``,
``GET /health`` (liveness: the ingress process answers), ``GET /ready`` (readiness: a
request would be served now; 503 otherwise), ``GET /v1/br/state``. Errors use OpenAI's
shape ``{"error": {"message", "type", "param", "code"}}``, unknown routes and wrong
methods included: 400 bad JSON, a body that is not ``application/json``, a bad or
unsupported field (named; see :mod:`br_serve.serve.frontend.openai_api`) or a prompt over the
context limit ("maximum context length", as vLLM), 401 missing or wrong API key (every
path but ``/health`` and ``/ready``), 404 unknown model or route, 405 wrong method, 429
the graph is at capacity (refused before any prefill work, with ``Retry-After``), 503
no decode replica alive.

Handle API: :meth:`Ingress.generate_stream` (see its docstring).

The scheduler, decode replica and KV keeper actors belong to the graph's ``Actors``
deployment (:class:`br_serve.serve.actors.ActorOwner`); each ingress replica borrows
their handles from it and asks it to replace a decode replica it lost, so the ingress
runs with any number of replicas (``serve.ingress_replicas``), each with its own
streams. Its constructor returns only when the graph would serve
a request (the scheduler has formed the barrier group, and one warm-up request went
through prefill, the pool, a decode replica and back), so Serve, and ``serve run``,
report the app ready only then.
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
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from br_serve.serve.actors import GraphActors
from br_serve.serve.config import GraphConfig
from br_serve.serve.frontend import openai_api as oa
from br_serve.serve.frontend.responses import ClosingStreamingResponse
from br_serve.serve.frontend.stopping import OutputFilter
from br_serve.serve.frontend.streams import GenerateError, Streamer, Token, make_prefill
from br_serve.transport.lease import KVLease

log = logging.getLogger(__name__)

api = FastAPI(title="BalanceRoute", docs_url=None, redoc_url=None)

#: bound on the constructor's wait for a ready graph (replica start-up included)
READY_WAIT_S = 300.0
#: warm-up requests that may fail (each retried after 0.5 s) before the deployment fails
WARM_UP_TRIES = 5


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


async def _apply_filter(gen: AsyncGenerator[list[Token], None],
                        filt: OutputFilter) -> AsyncGenerator[list[Token], None]:
    """``gen`` with stop strings, stop ids and echo applied, batch by batch; ends
    (closing ``gen``, which aborts the request on its replica) at the token that
    finishes the output."""
    try:
        async for batch in gen:
            out: list[Token] = []
            for tok in batch:
                if tok.error is not None:
                    out.append(tok)
                    yield out
                    return
                text, finished, reason = filt.push(tok.token_id, tok.text, tok.finished,
                                                   tok.finish_reason)
                out.append(dataclasses.replace(tok, text=text, finished=finished,
                                               finish_reason=reason))
                if finished:
                    yield out
                    return
            yield out
    finally:
        await gen.aclose()


def _generate_error(exc: GenerateError) -> JSONResponse:
    headers = ({"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None
               else None)
    param = exc.param
    if param is None and exc.status == 400 and exc.message.startswith("prompt:"):
        param = "prompt"
    return _error(exc.status, exc.message, exc.type, param, headers=headers)


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
    async def __init__(self, prefill: Any, owner: Any,  # type: ignore[misc]
                       cfg: GraphConfig) -> None:
        self.cfg = cfg
        self.api_key = self.cfg.resolved_api_key()
        actors: GraphActors = await owner.handles.remote()

        async def replace(g: int, old: Any) -> tuple[Any, str]:
            return await owner.replace.remote(g, old)  # type: ignore[no-any-return]

        async def resolve() -> GraphActors:
            return await owner.handles.remote()  # type: ignore[no-any-return]

        self.streamer = Streamer(self.cfg, await make_prefill(prefill, cfg), actors.scheduler,
                                 actors.decode, KVLease(None, keeper=actors.keeper), replace,
                                 channel_host=self.cfg.channel_host(), resolve=resolve,
                                 epoch=actors.epoch)
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

        self._start()
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
                    why = str(toks[-1].error) if toks else "no tokens"
                except GenerateError as exc:
                    why = exc.message
                    if 400 <= exc.status < 500 or exc.status == 502:  # will not heal
                        raise RuntimeError(f"ingress: warm-up failed: {why}") from None
                log.warning("ingress: warm-up failed: %s", why)
                if attempt >= WARM_UP_TRIES:  # bounded: a deployment error, not a hang
                    raise RuntimeError(f"ingress: warm-up failed {attempt} times; last: "
                                       f"{why}")
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
        return ready and gate.load() < gate.capacity()

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
        gen = self._timed(self.streamer.generate_batches(prompt, params, request_id))
        try:
            async for batch in gen:
                for tok in batch:
                    yield _token_dict(tok)
        except GenerateError as exc:
            item = {"index": 0, "finished": True, "finish_reason": "error",
                    "error": exc.message, "status": exc.status}
            if exc.retry_after_s is not None:
                item["retry_after_s"] = exc.retry_after_s
            yield item
        finally:
            await gen.aclose()  # closed at a yield: give the request up now (see _timed)

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
        return {"object": "list", "data": [{"id": self.cfg.serve.model, "object": "model",
                                            "created": 0, "owned_by": "br-serve"}]}

    @api.get("/v1/br/state")
    async def br_state(self, request: Request) -> Any:
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            return await self.state()
        except GenerateError as exc:  # the scheduler is unreachable: 503, not a 500
            return _generate_error(exc)

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
        if req.model is not None and req.model != self.cfg.serve.model:
            return _error(404, f"model: {req.model!r} does not exist; serving "
                          f"{self.cfg.serve.model!r}", "invalid_request_error", "model",
                          "model_not_found")
        prompt = req.prompt_value()
        params = req.sampling()
        filt = req.output_filter()
        rid = self.streamer.new_request_id()
        public_id = ("chatcmpl-" if chat else "cmpl-") + (req.request_id or rid)
        self._start()
        raw = self.streamer.generate_batches(prompt, params, rid)
        gen = self._timed(_apply_filter(raw, filt) if filt.active else raw)
        # A client gone before the response starts cancels this handler with either
        # front (Ray's serve/_private/proxy.py HTTPProxy.send_request_to_replica; with
        # HAProxy, replica.py _direct_ingress_asgi); the CancelledError runs gen's
        # finally clauses, which give the request up, as it passes through them.
        try:
            first = await gen.__anext__()
        except GenerateError as exc:
            return _generate_error(exc)
        except StopAsyncIteration:
            return _error(500, "empty generation", "server_error")
        if req.stream:
            include, continuous = req.stream_usage()
            return ClosingStreamingResponse(
                self._sse(first, gen, public_id, chat, include, continuous, filt),
                media_type="text/event-stream")
        toks = list(first)
        async for batch in gen:
            toks.extend(batch)
        last = toks[-1]
        if last.error is not None:
            return _error(500, last.error, "server_error")
        text = "".join(t.text for t in toks)
        use = oa.usage(toks[0].prompt_tokens, len(toks))
        return oa.completion_body(public_id, self.cfg.serve.model, text, last.finish_reason, use,
                                  chat, filt.stop_reason)

    async def _sse(self, first: list[Token], gen: AsyncGenerator[list[Token], None],
                   rid: str, chat: bool, include_usage: bool, continuous_usage: bool = False,
                   filt: OutputFilter | None = None) -> AsyncGenerator[str, None]:
        """SSE events of one stream: one chunk per token (OpenAI's shape), written
        together when they arrived together (fewer writes through Serve's proxy, the
        same bytes)."""
        model = self.cfg.serve.model
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
                    if not (is_first or tok.finished or continuous_usage):
                        out.append(middle.event(tok.text))
                        continue
                    use = (oa.usage(tok.prompt_tokens, n)
                           if tok.finished or continuous_usage else None)
                    stop_reason = (filt.stop_reason if filt is not None and tok.finished
                                   else None)
                    body = oa.chunk_body(rid, model, tok.text, tok.finish_reason
                                         if tok.finished else None, chat, first=is_first,
                                         use=use, stop_reason=stop_reason)
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

    async def _timed(self, gen: AsyncGenerator[list[Token], None]
                     ) -> AsyncGenerator[list[Token], None]:
        """Record TTFT and TPOT of one stream (batches pass through unchanged)."""
        t0 = time.perf_counter()
        t_first = 0.0
        n = 0
        try:
            async for batch in gen:
                if n == 0:
                    t_first = time.perf_counter()
                    if self._metrics is not None:
                        self._metrics.ttft_ms.observe((t_first - t0) * 1e3)
                n += len(batch)
                if batch[-1].finished and n > 1 and self._metrics is not None:
                    self._metrics.tpot_ms.observe(
                        (time.perf_counter() - t_first) * 1e3 / (n - 1))
                yield batch
        finally:
            # closed at a yield, ``async for`` leaves ``gen`` suspended: close it now
            # (its finally gives the request up), not when the collector finds it
            await gen.aclose()

