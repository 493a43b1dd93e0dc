"""State and HTTP plumbing shared by the vLLM and SGLang emulators.

:class:`Emulator` is the state of one emulator process (one config, one lock-step core
for a decode role, one KV broker for a prefill role, counters); every HTTP port of the
process (one, or one per rank) is a FastAPI app built over the same instance.

Endpoints every app serves: ``GET /health``, ``GET /v1/models``, ``GET
/emulator/stats`` (per-rank counters, KV releases, the emulator's CPU time, ignored
request fields by name, the barrier summary), ``GET /emulator/timeline`` (per request
key, the wall-clock times of its hops: :class:`~br_serve.emulator.runtime.Timeline`),
``GET /emulator/barrier`` (the summary of
what the lock-step barrier did) and ``GET /emulator/steps?since=N&limit=M`` (one row per
step: :mod:`br_serve.emulator.steplog`),
``POST /emulator/fault`` (with ``--enable-fault-injection``), and on a prefill role the
twin endpoints ``POST /emulator/kv/pull`` / ``POST /emulator/kv/release`` a decode
emulator calls (the stand-in for the connector's side channel / bootstrap server).

A client that disconnects is noticed at once (a watcher on the ASGI receive channel),
its request is aborted and its slot freed; a prefill whose client left holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from br_serve.emulator.config import EmulatorConfig
from br_serve.emulator.core import LockstepCore
from br_serve.emulator.ledger import KVLedger, KVRefused
from br_serve.emulator.openai import (
    DONE,
    ApiError,
    ChunkWriter,
    ParsedRequest,
    completion_body,
    parse_request,
)
from br_serve.emulator.runtime import (
    DROPPED,
    Counters,
    KVBroker,
    StepDriver,
    Timeline,
    now_s,
    process_cpu_s,
)
from br_serve.emulator.steplog import COLUMNS

T = TypeVar("T")
log = logging.getLogger("br_serve.emulator")


@dataclass(frozen=True, slots=True)
class Spec:
    """What differs between the protocols' HTTP surfaces."""

    name: str
    error_body: Callable[[ApiError], dict[str, Any]]
    stream_error: Callable[[ApiError], bytes]
    choice_extra: Mapping[str, Any]
    #: prefill side of the twin: complete the fields a decode presented before the
    #: ledger compares them (SGLang: the prefill DP rank the decode did not name)
    pull_defaults: Callable[[EmulatorConfig, str, dict[str, Any]], dict[str, Any]] = (
        lambda _cfg, _key, presented: presented)
    #: the engine's own SSE chunks, and its own non-streamed body from
    #: :func:`completion_body` (vLLM: :mod:`br_serve.emulator.vllm_wire`)
    writer: type[ChunkWriter] = ChunkWriter
    shape_body: Callable[[dict[str, Any], ParsedRequest], dict[str, Any]] = (
        lambda body, _req: body)


class RankDropped(Exception):
    """Raised inside a stream whose rank was dropped: the connection breaks mid-body."""


class Emulator:
    """One emulator process; build apps with the protocol module's ``build_app``."""

    def __init__(self, config: EmulatorConfig, spec: Spec) -> None:
        self.config = config
        self.spec = spec
        self.counters = Counters(config.dp_size)
        self.core = LockstepCore(config.step_model, config.slots, config.vocab_size)
        self.driver = StepDriver(self.core)
        self.broker = KVBroker(KVLedger(config.ttl_s, now_s))
        self.dropped: set[int] = set()
        self.stalled: set[int] = set()
        self.timeline = Timeline()
        self._ids = itertools.count()
        self._rr = itertools.count()
        self._client: httpx.AsyncClient | None = None
        self._started = 0

    # -- lifecycle (each app's lifespan calls these; the first start wins) ---------
    async def startup(self) -> None:
        self._started += 1
        if self._started > 1:
            return
        self.driver.start()
        self.broker.start()
        # idle connections dropped before the twin's uvicorn closes them (5 s): a pull
        # sent on a connection being closed would be lost (see remote.client.Timeouts)
        self._client = httpx.AsyncClient(timeout=self.config.twin_timeout_s,
                                         limits=httpx.Limits(keepalive_expiry=2.0))

    async def shutdown(self) -> None:
        self._started -= 1
        if self._started > 0:
            return
        await self.driver.stop()
        await self.broker.stop()
        if self._client is not None:
            await self._client.aclose()

    def parse(self, body: Any, chat: bool, extra_fields: frozenset[str],
              check_model: bool) -> ParsedRequest:
        """:func:`parse_request` under this server's strictness; an unknown field that is
        accepted is logged at debug level (as recent vLLM does) and counted by name."""
        cfg = self.config
        req = parse_request(body, chat, extra_fields, cfg.strict_fields, cfg.model,
                            check_model)
        if req.ignored_fields:
            log.debug("The following fields were present in the request but ignored: %s",
                      set(req.ignored_fields))
            seen = self.counters.ignored_fields
            for name in req.ignored_fields:
                seen[name] = seen.get(name, 0) + 1
        return req

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{self.config.engine_id}-{next(self._ids)}"

    def round_robin_rank(self) -> int:
        return next(self._rr) % self.config.dp_size

    def least_loaded_rank(self) -> int:
        """vLLM's DP load balancer score: ``4 * waiting + running``, lowest index first."""
        g = self.config.dp_size
        return min(range(g), key=lambda r: (4 * self.core.waiting_count(r)
                                            + self.core.running_count(r), r))

    def check_rank_alive(self, rank: int) -> None:
        if rank in self.dropped:
            raise ApiError(503, f"data parallel rank {rank} is not available "
                                "(dropped by fault injection)")

    async def run_prefill(self, request: Request, rank: int, prompt_tokens: int) -> None:
        """Take a prefill's modelled time on ``rank`` (counted in flight meanwhile);
        raises if the client goes away first."""
        cfg = self.config
        self.counters.inflight_prefills[rank] += 1
        try:
            delay = cfg.prefill_p0_s + cfg.prefill_p1_s_per_token * prompt_tokens
            await unless_disconnected(request, asyncio.sleep(delay))
        finally:
            self.counters.inflight_prefills[rank] -= 1

    # -- the twin (decode -> prefill) ----------------------------------------------
    async def pull_from_twin(self, host: str, port: int, key: str,
                             presented: Mapping[str, Any], wait_s: float) -> dict[str, Any]:
        """Take the KV ``key`` from the prefill emulator at ``host:port``.

        Raises:
            ApiError: 400 when the twin never issued it (or it was released, or the
                fields differ); 503 when the twin cannot be reached.
        """
        assert self._client is not None
        url = f"http://{host}:{port}/emulator/kv/pull"
        body = {"key": key, "presented": dict(presented), "wait_s": wait_s}
        try:
            r = await self._client.post(url, json=body, headers=self._auth(),
                                        timeout=self.config.twin_timeout_s + wait_s)
        except httpx.HTTPError as exc:
            raise ApiError(503, f"KV transfer: prefill server at {host}:{port} is not "
                                f"reachable ({type(exc).__name__})") from None
        if r.status_code != 200:
            try:
                detail = r.json().get("message", r.text)
            except ValueError:
                detail = r.text
            raise ApiError(400, f"KV transfer refused by {host}:{port}: {detail}",
                           param="kv_transfer_params")
        return dict(r.json())

    async def release_at_twin(self, host: str, port: int, key: str) -> None:
        """Best-effort: tell the twin a decode refused ``key`` (it frees the KV)."""
        assert self._client is not None
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(f"http://{host}:{port}/emulator/kv/release",
                                    json={"key": key}, headers=self._auth())

    def _auth(self) -> dict[str, str]:
        key = self.config.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- decode serving --------------------------------------------------------------
    async def decode_response(self, request: Request, rid: str, response_id: str,
                              rank: int, req: ParsedRequest, mark_key: str | None = None
                              ) -> Response:
        """Admit ``req`` on ``rank`` and answer it (an SSE stream or one JSON body);
        ``mark_key``: the timeline key under which the first token is marked."""
        raw_queue = self.driver.submit(rid, rank, req.prompt_tokens, req.max_tokens,
                                       req.seed)
        queue: Any = raw_queue if mark_key is None else _Marked(raw_queue, self.timeline,
                                                           mark_key)
        writer = self.spec.writer(response_id, req, self.spec.choice_extra)

        async def stream() -> AsyncIterator[bytes]:
            head = writer.role()
            if head is not None:
                yield head
            emitted = 0
            while True:
                ev = await queue.get()
                if ev is DROPPED:
                    raise RankDropped(f"rank {rank} dropped")
                emitted = ev.position + 1
                yield writer.token(ev.text, emitted, ev.finished)
                if ev.finished:
                    break
            tail = writer.final_usage(emitted)
            if tail is not None:
                yield tail
            yield DONE

        if req.stream:
            return TokenStream(stream(), lambda: self.driver.cancel(rid))

        async def collect() -> list[str]:
            parts: list[str] = []
            while True:
                ev = await queue.get()
                if ev is DROPPED:
                    raise ApiError(500, f"data parallel rank {rank} failed")
                parts.append(ev.text)
                if ev.finished:
                    return parts

        try:
            parts = await unless_disconnected(request, collect())
        finally:
            self.driver.cancel(rid)
        body = completion_body(response_id, req, "".join(parts), len(parts),
                               self.spec.choice_extra)
        return JSONResponse(self.spec.shape_body(body, req))

    # -- observation -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        cfg, core = self.config, self.core
        ranks = []
        for g in range(cfg.dp_size):
            c = core.counters[g]
            ranks.append({"rank": g, "admitted": list(c.admitted), "tokens": c.tokens,
                          "finished": c.finished, "aborted": c.aborted,
                          "running": core.running_count(g), "waiting": core.waiting_count(g),
                          "load_tokens": core.load_tokens(g), "max_running": c.max_running,
                          "kv_pulls": self.counters.kv_pulls[g],
                          "kv_recomputes": self.counters.kv_recomputes[g],
                          "prefills": self.counters.prefills[g],
                          "prefill_ids": list(self.counters.prefill_ids[g]),
                          "dropped": g in self.dropped, "stalled": g in self.stalled})
        return {"protocol": cfg.protocol, "role": cfg.role, "dp_size": cfg.dp_size,
                "ports": cfg.ports(), "engine_id": cfg.engine_id, "steps": core.steps,
                "step_cpu_s": self.driver.step_cpu_s, "overrun_s": self.driver.overrun_s,
                "process_cpu_s": process_cpu_s(), "refused": dict(self.counters.refused),
                "ignored_fields": dict(self.counters.ignored_fields),
                "barrier": self.driver.log.summary(),
                "kv": self.broker.ledger.snapshot(), "ranks": ranks}


class _Marked:
    """A token queue that marks ``first_token`` in the timeline at its first event."""

    __slots__ = ("_key", "_queue", "_timeline")

    def __init__(self, queue: asyncio.Queue[Any], timeline: Timeline, key: str) -> None:
        self._queue, self._timeline, self._key = queue, timeline, key

    async def get(self) -> Any:
        ev = await self._queue.get()
        self._timeline.mark(self._key, "first_token")
        return ev


class TokenStream(StreamingResponse):
    """An SSE response that aborts its request when the client goes away."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], object]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streamer = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({streamer, watcher},
                                         return_when=asyncio.FIRST_COMPLETED)
            if streamer in done and not isinstance(streamer.exception(), RankDropped):
                streamer.result()
            # RankDropped: return without finishing the body; the server then closes the
            # connection mid-stream, as a dying engine's socket would.
        finally:
            for task in (streamer, watcher):
                task.cancel()
            await asyncio.gather(streamer, watcher, return_exceptions=True)
            self._on_close()


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ApiError."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ApiError(499, "client disconnected", type_="ClientDisconnected")


async def json_body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise ApiError(400, "request body: not valid JSON") from None


def build_base_app(emu: Emulator, rank: int | None) -> FastAPI:
    """The shared endpoints and error handling; ``rank``: this port's fixed rank."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await emu.startup()
        try:
            yield
        finally:
            await emu.shutdown()

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    spec, cfg = emu.spec, emu.config

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        if exc.status != 499:
            emu.counters.refuse(exc.type)
        return JSONResponse(spec.error_body(exc), status_code=exc.status)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        err = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(spec.error_body(err), status_code=500)

    if cfg.api_key:
        want = f"Bearer {cfg.api_key}"

        @app.middleware("http")
        async def _auth(request: Request, call_next: Any) -> Response:
            path = request.url.path
            guarded = path.startswith(("/v1", "/emulator", "/abort_request"))
            if guarded and request.headers.get("authorization") != want:
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            resp: Response = await call_next(request)
            return resp

    @app.get("/health")
    async def health() -> Response:
        if rank is not None and rank in emu.dropped:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": cfg.model, "object": "model",
                                            "owned_by": cfg.protocol, "root": cfg.model,
                                            "max_model_len": cfg.kv_limit_tokens}]}

    @app.get("/emulator/stats")
    async def stats() -> dict[str, Any]:
        return emu.stats()

    @app.get("/emulator/timeline")
    async def timeline() -> dict[str, Any]:
        return {"role": cfg.role, "marks": emu.timeline.marks,
                "dropped": emu.timeline.dropped}

    @app.get("/emulator/barrier")
    async def barrier() -> dict[str, Any]:
        return emu.driver.log.summary()

    @app.get("/emulator/steps")
    async def steps(since: int = 0, limit: int | None = None) -> dict[str, Any]:
        if since < 0 or (limit is not None and limit < 1):
            raise ApiError(400, "since: must be >= 0 and limit >= 1", "since")
        steplog = emu.driver.log
        return {"dp_size": cfg.dp_size, "steps": steplog.steps, "columns": list(COLUMNS),
                "step_model": {"a_s_per_token": list(steplog.a), "b_s": list(steplog.b)},
                "rows": steplog.rows(since, limit)}

    if cfg.enable_fault_injection:
        @app.post("/emulator/fault")
        async def fault(request: Request) -> dict[str, Any]:
            body = await json_body(request)
            g, mode = body.get("rank"), body.get("mode")
            if not isinstance(g, int) or not 0 <= g < cfg.dp_size:
                raise ApiError(400, f"rank: must be an integer in [0, {cfg.dp_size})", "rank")
            if mode == "drop":
                emu.dropped.add(g)
                ids = emu.driver.drop_rank(g)
            elif mode == "stall":
                emu.stalled.add(g)
                emu.core.set_stalled(g, True)
                ids = []
            elif mode == "recover":
                emu.dropped.discard(g)
                emu.stalled.discard(g)
                emu.core.set_stalled(g, False)
                ids = []
            else:
                raise ApiError(400, "mode: must be drop, stall or recover", "mode")
            return {"rank": g, "mode": mode, "affected": ids}

    if cfg.role == "prefill":
        @app.post("/emulator/kv/pull")
        async def kv_pull(request: Request) -> JSONResponse:
            body = await json_body(request)
            key, presented = str(body.get("key")), dict(body.get("presented") or {})
            presented = spec.pull_defaults(cfg, key, presented)
            wait_s = min(float(body.get("wait_s") or 0.0), 3600.0)
            try:
                hold = await emu.broker.pull(key, presented, wait_s)
            except KVRefused as exc:
                return JSONResponse({"reason": exc.reason, "message": str(exc)},
                                    status_code=404 if exc.reason == "unknown" else 409)
            return JSONResponse({"key": key, "prompt_tokens": hold.prompt_tokens,
                                 "rank": hold.rank})

        @app.post("/emulator/kv/release")
        async def kv_release(request: Request) -> dict[str, Any]:
            body = await json_body(request)
            return {"released": emu.broker.abort(str(body.get("key")))}

    return app


#: a role's handler: (request, its JSON object body, chat?) -> the response
Handler = Callable[[Request, dict[str, Any], bool], Awaitable[Response]]


def add_completion_routes(app: FastAPI, role: str, prefill: Handler,
                          decode: Handler) -> None:
    """``POST /v1/completions`` and ``/v1/chat/completions``: a JSON object body
    (else 400), handled by ``prefill`` or ``decode`` as ``role`` says."""
    handler = prefill if role == "prefill" else decode

    async def serve(request: Request, chat: bool) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "request body: must be a JSON object")
        return await handler(request, body, chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)
