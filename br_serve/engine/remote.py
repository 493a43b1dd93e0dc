"""A decode engine that is one DP rank of a remote vLLM / SGLang server.

:class:`RemoteDecodeEngine` follows the :class:`~br_serve.engine.base.DecodeEngine`
contract, so a decode replica actor proxies a remote rank exactly as it drives a local
engine: the scheduler, the mirror, the barrier and the policies see no difference.

- ``admit(rid, ticket, ...)`` opens the streamed decode call for the
  :class:`~br_serve.remote.ticket.RemoteTicket` (pinned to this rank) on the engine's
  own event loop thread; the engine pulls the KV itself.
- ``step()`` waits until tokens arrived (at most ``max_wait_s``, or until
  :meth:`nudge` says an admission waits to be installed), then a short gather
  (until every request that is flowing delivered one, at most ``gather_s``), and
  returns them as :class:`TokenEvent` values: one remote decode step of this rank.
  A chunk carrying several tokens (``continuous_usage_stats``) gives that many events
  (the text on the first). Token ids are not streamed by the engines: ``token_id`` is
  -1.
- A request whose stream fails (HTTP error, error event, stall, broken connection) is
  reported by :meth:`take_failures` (``retryable`` except a 4xx that is the request's
  own fault); one that failed before its first token also gets its prefill hold
  released (``cancel`` / ``abort_request``: idempotent on the engine). ``abort``
  closes the stream, which makes the engine abort the request.
- The rank is taken for gone after a 503 (the rank refuses work), a connection-level
  failure whose health probe fails, or ``down_after`` failed streams in a row:
  :meth:`step` then raises :class:`RemoteRankDown` (the replica looks dead and is
  replaced; the replacement waits for the rank's health, see :meth:`wait_healthy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from br_serve.engine.base import DecodeEngine, EngineCapabilities, SamplingParams, TokenEvent
from br_serve.remote.client import RemoteEngineClient, Timeouts
from br_serve.remote.errors import (
    EngineDisconnected,
    EngineHTTPError,
    EngineTimeout,
    EngineUnreachable,
    RemoteEngineError,
    StreamBroken,
    StreamStalled,
)
from br_serve.remote.h1stream import open_stream
from br_serve.remote.requests import bearer, endpoint_path
from br_serve.remote.sse import TokenChunk
from br_serve.remote.ticket import RemoteTicket

log = logging.getLogger(__name__)

_CONNECTION = (EngineUnreachable, EngineDisconnected, EngineTimeout, StreamBroken,
               StreamStalled)


class RemoteRankDown(RuntimeError):
    """The remote rank stopped answering (a fault of the engine: the replica exits)."""


@dataclass(slots=True)
class _Req:
    ticket: RemoteTicket
    prompt_tokens: int
    decoded: int = 0          # tokens handed out by step()
    received: int = 0         # tokens the stream delivered (stream thread)
    aborted: bool = False
    future: Future[None] | None = field(default=None, repr=False)


class RemoteDecodeEngine(DecodeEngine):
    """DP rank ``rank`` (pinned with ``pin``, or None for a server of its own) of the
    engine at ``url``. ``clock`` only times the waits of :meth:`step`."""

    #: its step waits for the remote streams' tokens (an admission must wake it), and
    #: a stream can break on its own (reported by :meth:`take_failures`)
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(wakes_on_admit=True,
                                                                    fails_streams=True)

    def __init__(self, url: str, pin: int | None, timeouts: Timeouts | None = None,
                 api_key: str | None = None, *, gather_s: float = 0.004,
                 max_wait_s: float = 1.0, down_after: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url.rstrip("/")
        self.pin = pin
        self.gather_s = gather_s
        self.max_wait_s = max_wait_s
        self.down_after = down_after
        self._clock = clock
        self._timeouts = timeouts or Timeouts()
        self._cv = threading.Condition()
        self._reqs: dict[str, _Req] = {}        # step thread only
        self._arrived: list[TokenEvent] = []    # under _cv
        self._arrived_ids: set[str] = set()     # under _cv: requests in _arrived
        self._expect = 1 << 30                  # under _cv: requests a gather waits for
        self._nudged = False                    # under _cv: see nudge()
        self._failures: list[tuple[str, str, bool]] = []  # under _cv
        self._fault: str | None = None          # under _cv
        self._failed_in_row = 0                 # loop thread only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"remote-rank-{pin if pin is not None else url}")
        self._thread.start()
        self._client: RemoteEngineClient = self._call(self._make_client(api_key))
        self._auth = bearer(api_key)

    async def _make_client(self, api_key: str | None) -> RemoteEngineClient:
        return RemoteEngineClient(self._timeouts, api_key=api_key)

    def _call(self, coro: Any, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    # -- start-up --------------------------------------------------------------------
    def wait_healthy(self, wait_s: float) -> None:
        """Block until ``GET /health`` answers 200, at most ``wait_s``.

        Raises:
            RemoteRankDown: naming the URL and the last error.
        """
        deadline = self._clock() + wait_s
        while True:
            try:
                self._call(self._client.health(self.url), self._timeouts.connect_s * 3)
                return
            except (RemoteEngineError, TimeoutError) as exc:
                if self._clock() >= deadline:
                    raise RemoteRankDown(f"decode rank {self.pin} at {self.url}: not "
                                         f"healthy after {wait_s:g} s ({exc})") from None
            time.sleep(0.5)

    # -- DecodeEngine ----------------------------------------------------------------
    def admit(self, request_id: str, kv: Any, prompt_tokens: int, first_token_id: int,
              params: SamplingParams) -> None:
        if request_id in self._reqs:
            raise ValueError(f"request {request_id!r} is already running here")
        if not isinstance(kv, RemoteTicket):
            raise ValueError(f"request {request_id!r}: a remote rank needs a RemoteTicket "
                             f"(got {type(kv).__name__}); is the graph's engine remote?")
        req = _Req(kv, kv.prompt_tokens or prompt_tokens)
        body, headers = kv.decode_call(request_id, self.pin)
        self._reqs[request_id] = req
        req.future = asyncio.run_coroutine_threadsafe(
            self._stream(request_id, req, body, headers), self._loop)

    def step(self) -> list[TokenEvent]:
        with self._cv:
            if self._fault is not None:
                raise RemoteRankDown(self._fault)
            if not self._reqs:
                return []
            deadline = self._clock() + self.max_wait_s
            while (not self._arrived and not self._failures and self._fault is None
                   and not self._nudged):
                left = deadline - self._clock()
                if left <= 0:
                    break
                self._cv.wait(left)
            if self._arrived:  # gather the rest of this remote step
                # requests past their first token produce one per remote step
                flowing = {r for r, q in self._reqs.items() if q.received > 0}
                self._expect = len(flowing)
                end = self._clock() + self.gather_s
                while self._fault is None:
                    left = end - self._clock()
                    if left <= 0 or flowing <= self._arrived_ids:
                        break
                    self._cv.wait(left)
            events, self._arrived = self._arrived, []
            self._nudged = False
            self._arrived_ids = set()
            self._expect = 1 << 30
        out: list[TokenEvent] = []
        for e in events:
            req = self._reqs.get(e.request_id)
            if req is None or req.aborted:
                continue  # aborted or failed meanwhile
            req.decoded = e.index + 1
            out.append(e)
            if e.finished:
                del self._reqs[e.request_id]
        return out

    def nudge(self) -> None:
        """New work waits for the step thread (an admission): end a wait for tokens
        now, so that it is installed without waiting for this rank's next token."""
        with self._cv:
            self._nudged = True
            self._cv.notify_all()

    def take_failures(self) -> list[tuple[str, str, bool]]:
        """``(request_id, message, retryable)`` of streams that failed since the last
        call; those requests no longer run here."""
        with self._cv:
            failures, self._failures = self._failures, []
        out = []
        for rid, msg, retryable in failures:
            req = self._reqs.pop(rid, None)
            if req is not None and not req.aborted:
                out.append((rid, msg, retryable))
        return out

    def abort(self, request_id: str) -> None:
        req = self._reqs.pop(request_id, None)
        if req is None:
            return
        req.aborted = True
        if req.future is not None:
            req.future.cancel()  # closes the connection: the engine aborts it
        if req.received == 0:  # its decode may never have pulled the KV
            self._loop.call_soon_threadsafe(self._spawn_release, req.ticket)

    def load_tokens(self) -> int:
        return sum(q.prompt_tokens + q.decoded for q in self._reqs.values())

    def running(self) -> int:
        return len(self._reqs)

    def running_ids(self) -> list[str]:
        return list(self._reqs)

    def prompt_tokens_of(self, request_id: str) -> int:
        return self._reqs[request_id].prompt_tokens

    def decoded_steps(self, request_id: str) -> int:
        return self._reqs[request_id].decoded

    def close(self) -> None:
        for rid in list(self._reqs):
            self.abort(rid)
        closing = asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop)
        try:
            closing.result(5.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)

    # -- the stream (engine loop thread) ---------------------------------------------
    async def _stream(self, rid: str, req: _Req, body: dict[str, Any],
                      headers: dict[str, str]) -> None:
        url = self.url + endpoint_path(False)
        try:
            if url.startswith("http://"):
                await self._stream_h1(rid, req, url, body, headers)
            else:  # https: httpx (slower per chunk, see br_serve.remote.h1stream)
                async with contextlib.aclosing(self._client.stream(url, body,
                                                                   headers)) as chunks:
                    async for ev in chunks:
                        # aborted: abort()'s cancellation can be lost, since before
                        # Python 3.12 asyncio.wait_for (in the client) swallows one
                        # that races a result; the engine would decode to the end
                        if req.aborted or self._on_event(rid, req, ev):
                            break
            if req.aborted:
                return  # closed on purpose: no failure of the rank
            if req.received == 0:
                raise StreamBroken(url, "stream ended without a token", 0)
            self._failed_in_row = 0
        except asyncio.CancelledError:
            raise
        except RemoteEngineError as exc:
            await self._failed(rid, req, exc)
        except Exception as exc:
            log.exception("remote rank %s: stream of %s failed", self.pin, rid)
            await self._failed(rid, req, exc)

    async def _stream_h1(self, rid: str, req: _Req, url: str, body: dict[str, Any],
                         headers: dict[str, str]) -> None:
        t = self._timeouts
        stream = await open_stream(url, body, {**self._auth, **headers},
                                   lambda ev: self._on_event(rid, req, ev), t.connect_s)
        if req.aborted:  # its cancellation raced the connect (lost in asyncio.wait_for)
            stream.close()
            return
        try:
            await stream.wait(t.first_byte_s, t.stall_s)
        finally:
            stream.close()  # no-op after [DONE]; else the engine aborts the request

    def _on_event(self, rid: str, req: _Req, ev: Any) -> bool:
        """One parsed stream event (loop thread); True after the last token."""
        if not isinstance(ev, TokenChunk):
            return False
        if ev.usage is not None and ev.usage.prompt_tokens:
            req.prompt_tokens = ev.usage.prompt_tokens  # the engine's own count
        n = ev.new_tokens or (1 if ev.finish_reason else 0)
        if n == 0:
            return False
        first = req.received
        req.received += n
        fin = ev.finish_reason
        with self._cv:
            for i in range(n):
                last = i == n - 1
                self._arrived.append(TokenEvent(rid, -1, ev.text if i == 0 else "",
                                                first + i, fin is not None and last,
                                                fin if last else None))
            self._arrived_ids.add(rid)
            # wake the step thread only when it can act: the first arrival of a step,
            # or the last of the requests it gathers (a wake-up per chunk would cost
            # a GIL hand-over per token)
            if len(self._arrived_ids) == 1 or len(self._arrived_ids) >= self._expect:
                self._cv.notify_all()
        return fin is not None

    async def _failed(self, rid: str, req: _Req, exc: BaseException) -> None:
        retryable = not (isinstance(exc, EngineHTTPError) and not exc.retryable)
        if isinstance(exc, EngineHTTPError) and exc.status == 400:
            # a refused transfer (expired or unknown parameters) is cured by a new
            # prefill; other 400s are the request's own fault and would fail again
            text = str(exc).lower()
            retryable = "kv" in text or "transfer" in text or "bootstrap" in text
        msg = f"decode rank {self.pin} ({self.url}): {exc}"
        if req.received == 0:
            await self._release(req.ticket)
        down = None
        if isinstance(exc, _CONNECTION) or (isinstance(exc, EngineHTTPError)
                                             and exc.status >= 500):
            self._failed_in_row += 1
            # a 503 is the rank itself refusing work (unavailable): out at once, since
            # the health of a server shared by all ranks cannot show one rank's state
            unavailable = isinstance(exc, EngineHTTPError) and exc.status == 503
            if (unavailable or self._failed_in_row >= self.down_after
                    or not await self._healthy()):
                down = f"{msg}; rank taken for gone"
        with self._cv:
            self._failures.append((rid, msg, retryable))
            if down is not None and self._fault is None:
                self._fault = down
            self._cv.notify_all()

    async def _healthy(self) -> bool:
        try:
            await self._client.health(self.url)
            return True
        except RemoteEngineError:
            return False

    def _spawn_release(self, ticket: RemoteTicket) -> None:
        if ticket.prompt_keyed:  # nothing held on the prefill server
            return
        self._loop.create_task(self._release(ticket))

    async def _release(self, ticket: RemoteTicket) -> None:
        url, body = ticket.release_call()
        try:
            await self._client.request_json("POST", url, body,
                                            timeout_s=self._timeouts.connect_s * 2)
        except EngineHTTPError as exc:
            if exc.status != 404:  # 404: pulled, aborted or expired already
                log.warning("remote rank %s: release at %s: %s", self.pin, url, exc)
        except RemoteEngineError as exc:
            log.warning("remote rank %s: release at %s: %s", self.pin, url, exc)


#: a remote rank's proxy waits this long for the rank's health before it gives up
REMOTE_START_WAIT_S = 30.0


def remote_rank(cfg: Any, index: int) -> RemoteDecodeEngine:
    """The proxy of remote DP rank ``index`` of a graph's ``remote`` section
    (:class:`~br_serve.engine.remote_spec.RemoteConfig`; waits for its health, bounded).

    Raises:
        RemoteRankDown: the rank did not answer ``/health`` in time.
    """
    url, pin = cfg.decode_target(index)
    engine = RemoteDecodeEngine(url, pin, Timeouts(
        connect_s=cfg.connect_s, first_byte_s=cfg.first_token_s,
        stall_s=cfg.stall_s, keepalive_s=cfg.keepalive_s),
        api_key=cfg.api_key)
    engine.wait_healthy(REMOTE_START_WAIT_S)
    return engine
