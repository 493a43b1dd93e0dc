"""An async HTTP client for remote vLLM / SGLang engines, with explicit timeouts.

One :class:`RemoteEngineClient` (one httpx connection pool) per process is enough; it
is safe to use from many tasks of one event loop. Every failure is one of the
exceptions of :mod:`br_serve.remote.errors`, never a bare httpx error:

- cannot connect -> :class:`EngineUnreachable`;
- non-200 -> :class:`EngineHTTPError` (``.status``, ``.error`` parsed, ``.retryable``);
- no answer within the timeout -> :class:`EngineTimeout`;
- a stream: an error event -> :class:`EngineStreamError`; no byte for ``stall_s`` ->
  :class:`StreamStalled`; the connection dropping or the body ending without
  ``[DONE]`` -> :class:`StreamBroken`. Leaving :meth:`RemoteEngineClient.stream` early
  (exception or ``break``) closes the connection, which makes the engine abort the
  request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from br_serve.remote.errors import (
    EngineDisconnected,
    EngineHTTPError,
    EngineProtocolError,
    EngineStreamError,
    EngineTimeout,
    EngineUnreachable,
    StreamBroken,
    StreamStalled,
    parse_error_body,
)
from br_serve.remote.loads import RankLoad, sglang_rank_loads, vllm_rank_loads
from br_serve.remote.requests import (
    KEEPALIVE_S,
    Bootstrap,
    bearer,
    check_vllm_kv_params,
    endpoint_path,
    sglang_prefill_request,
    vllm_prefill_request,
)
from br_serve.remote.sse import DecodeStreamParser, Done, ErrorEvent, StreamEvent


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``request_s``: a whole non-streamed call; ``first_byte_s``: a stream's
    headers and first chunk (KV transfer included); ``stall_s``: most time between two
    chunks of a stream once it flows; ``keepalive_s``: how long an idle pooled
    connection is reused.

    ``keepalive_s`` must stay below the engine server's own keep-alive timeout (uvicorn's
    default of 5 s, which vLLM keeps unless ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` is set).
    With equal bounds a request sent on a connection the server is closing at that
    moment is lost without an answer (``ReadError``): measured 5-6 of 1,440 requests
    sent after 4.90-5.05 s of idleness with httpx's default of 5 s, 0 of 1,440 with 2 s
    (``research/keepalive_race.py``)."""

    connect_s: float = 3.0
    request_s: float = 120.0
    first_byte_s: float = 120.0
    stall_s: float = 30.0
    keepalive_s: float = KEEPALIVE_S

    def __post_init__(self) -> None:
        for name in ("connect_s", "request_s", "first_byte_s", "stall_s", "keepalive_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"timeouts.{name}: must be > 0 (got {getattr(self, name)})")


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """A prefill's answer: its one token and (vLLM) the decode's transfer parameters."""

    request_id: str
    text: str
    prompt_tokens: int
    kv_transfer_params: dict[str, Any] | None
    finish_reason: str | None


class RemoteEngineClient:
    """Calls to engines by base URL (``http://host:port``, no trailing path)."""

    def __init__(self, timeouts: Timeouts | None = None, api_key: str | None = None,
                 max_connections: int = 2048,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.timeouts = timeouts or Timeouts()
        t = self.timeouts
        self._http = httpx.AsyncClient(
            headers=bearer(api_key), transport=transport,
            timeout=httpx.Timeout(t.request_s, connect=t.connect_s),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections,
                                keepalive_expiry=t.keepalive_s))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RemoteEngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plain calls -------------------------------------------------------------------
    async def request_json(self, method: str, url: str, body: Any = None,
                           headers: Mapping[str, str] | None = None,
                           timeout_s: float | None = None) -> Any:
        """One call answered with JSON (``None`` for an empty 200 body)."""
        timeout = httpx.Timeout(timeout_s or self.timeouts.request_s,
                                connect=self.timeouts.connect_s)
        try:
            r = await self._http.request(method, url, json=body, headers=headers,
                                         timeout=timeout)
        except httpx.ConnectError as exc:
            raise EngineUnreachable(url, f"cannot connect ({exc})") from None
        except httpx.ConnectTimeout:
            raise EngineUnreachable(url, "connect timed out "
                                         f"({self.timeouts.connect_s:g} s)") from None
        except httpx.TimeoutException:
            raise EngineTimeout(url, f"no answer within {timeout.read:g} s") from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise EngineDisconnected(url, f"connection lost ({exc})") from None
        if r.status_code != 200:
            raise _http_error(url, r.status_code, r.text)
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise EngineProtocolError(url, f"answer is not JSON: {r.text[:120]!r}") from None

    async def health(self, base_url: str) -> None:
        """Raise unless ``GET /health`` answers 200."""
        url = f"{base_url}/health"
        await self.request_json("GET", url, timeout_s=self.timeouts.connect_s * 2)

    # -- prefill -------------------------------------------------------------------------
    async def vllm_prefill(self, base_url: str, body: Mapping[str, Any], request_id: str,
                           chat: bool = False, rank: int | None = None,
                           kv_handoff: str = "params") -> PrefillResult:
        """Prefill on a vLLM ``kv_producer``; returns the decode's transfer parameters.

        ``kv_handoff`` (``remote.kv_handoff``): ``params`` requires them in the answer,
        ``prompt`` requires none (a prompt-keyed connector), ``auto`` takes either
        (``kv_transfer_params`` None: none came)."""
        url = base_url + endpoint_path(chat)
        pbody, headers = vllm_prefill_request(body, request_id, rank)
        answer = await self.request_json("POST", url, pbody, headers)
        raw = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if raw is None and kv_handoff != "params":
            return _prefill_result(url, request_id, answer, None)
        if raw is not None and kv_handoff == "prompt":
            raise EngineProtocolError(url, "kv_transfer_params: the prefill answer carries "
                                           "them but remote.kv_handoff is 'prompt' (set it "
                                           "to 'params' or 'auto')")
        try:
            params = check_vllm_kv_params(raw)
        except (ValueError, AttributeError) as exc:
            hint = (" (a prompt-keyed connector such as ExampleConnector or LMCache: set "
                    "remote.kv_handoff=prompt or auto)" if raw is None else "")
            raise EngineProtocolError(url, f"{exc}{hint}") from None
        return _prefill_result(url, request_id, answer, params)

    async def sglang_prefill(self, base_url: str, body: Mapping[str, Any],
                             bootstrap: Bootstrap, request_id: str, chat: bool = False,
                             rank: int | None = None,
                             timeout_s: float | None = None,
                             tries: int = 3) -> PrefillResult:
        """Prefill on an SGLang prefill server; returns when the decode took the KV.

        Start it as a task alongside the decode stream: SGLang answers it only after
        the KV moved (or the bootstrap timed out: an :class:`EngineHTTPError`).

        A call whose connection is lost before the answer (:class:`EngineDisconnected`)
        is sent again at once, up to ``tries`` calls in all. The decode waits for this
        room's KV, which only this call brings, so a lost call would leave it waiting
        until its own first-token bound. A healthy server closes a connection only
        between requests: one lost before the answer is an idle pooled connection the
        server was closing as the request went out, and the request never reached it,
        so the same room is safe to send again. An answer (a refusal), a timeout or an
        engine that cannot be reached is not retried.
        """
        if tries < 1:
            raise ValueError(f"tries: must be >= 1 (got {tries})")
        url = base_url + endpoint_path(chat)
        pbody = sglang_prefill_request(body, bootstrap, request_id, rank)
        for attempt in range(1, tries + 1):
            try:
                answer = await self.request_json("POST", url, pbody, timeout_s=timeout_s)
                break
            except EngineDisconnected:
                if attempt >= tries:
                    raise
        return _prefill_result(url, request_id, answer, None)

    # -- decode stream ------------------------------------------------------------------
    async def stream(self, url: str, body: Mapping[str, Any],
                     headers: Mapping[str, str] | None = None
                     ) -> AsyncGenerator[StreamEvent, None]:
        """POST ``body`` to ``url`` and yield its events up to and including ``Done``.

        Raises:
            EngineUnreachable, EngineHTTPError, EngineTimeout: before the stream starts.
            EngineStreamError, StreamStalled, StreamBroken, EngineProtocolError: after.
        """
        t = self.timeouts
        timeout = httpx.Timeout(t.first_byte_s, connect=t.connect_s)
        parser = DecodeStreamParser(url)
        try:
            async with self._http.stream("POST", url, json=dict(body), headers=headers,
                                         timeout=timeout) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    raise _http_error(url, r.status_code, text)
                chunks = r.aiter_raw()
                wait = t.first_byte_s
                while True:
                    try:
                        chunk = await asyncio.wait_for(anext(chunks), wait)
                    except StopAsyncIteration:
                        break
                    except asyncio.TimeoutError:
                        raise StreamStalled(url, wait, parser.completion_tokens) from None
                    for ev in parser.feed(chunk):
                        if isinstance(ev, ErrorEvent):
                            raise EngineStreamError(url, ev.error)
                        yield ev
                        if isinstance(ev, Done):  # not parser.done: set once the
                            return                # whole chunk (more events) parsed
                    if parser.completion_tokens:
                        wait = t.stall_s
                for ev in parser.finish():  # raises StreamBroken without [DONE]
                    yield ev
        except httpx.ConnectError as exc:
            raise EngineUnreachable(url, f"cannot connect ({exc})") from None
        except httpx.ConnectTimeout:
            raise EngineUnreachable(url, f"connect timed out ({t.connect_s:g} s)") from None
        except httpx.TimeoutException:
            raise EngineTimeout(url, f"no answer within {t.first_byte_s:g} s") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise StreamBroken(url, f"connection lost ({type(exc).__name__}: {exc})",
                               parser.completion_tokens) from None

    # -- load and control -----------------------------------------------------------------
    async def metrics_text(self, base_url: str) -> str:
        url = f"{base_url}/metrics"
        try:
            r = await self._http.get(url, timeout=httpx.Timeout(
                self.timeouts.request_s, connect=self.timeouts.connect_s))
        except httpx.ConnectError as exc:
            raise EngineUnreachable(url, f"cannot connect ({exc})") from None
        except httpx.TimeoutException:
            raise EngineTimeout(url, "no answer") from None
        if r.status_code != 200:
            raise _http_error(url, r.status_code, r.text)
        return r.text

    async def vllm_rank_loads(self, base_url: str,
                              model_name: str | None = None) -> dict[int, RankLoad]:
        text = await self.metrics_text(base_url)
        try:
            return vllm_rank_loads(text, model_name)
        except ValueError as exc:
            raise EngineProtocolError(f"{base_url}/metrics", str(exc)) from None

    async def sglang_rank_loads(self, base_url: str) -> dict[int, RankLoad]:
        url = f"{base_url}/v1/loads"
        body = await self.request_json("GET", url)
        try:
            return sglang_rank_loads(body)
        except (ValueError, AttributeError) as exc:
            raise EngineProtocolError(url, str(exc)) from None

    async def vllm_cancel(self, base_url: str, request_id: str) -> bool:
        """``POST /v1/requests/{id}/cancel``; ``False`` when the engine does not know it."""
        try:
            await self.request_json("POST", f"{base_url}/v1/requests/{request_id}/cancel")
        except EngineHTTPError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def sglang_abort(self, base_url: str, request_id: str) -> None:
        """SGLang's ``POST /abort_request {"rid"}`` (frees a prefill's held room too)."""
        await self.request_json("POST", f"{base_url}/abort_request", {"rid": request_id})


def _http_error(url: str, status: int, text: str) -> EngineHTTPError:
    try:
        info = parse_error_body(json.loads(text))
    except ValueError:
        info = None
    return EngineHTTPError(url, status, info, text)


def _prefill_result(url: str, request_id: str, answer: Any,
                    params: dict[str, Any] | None) -> PrefillResult:
    try:
        choice = answer["choices"][0]
        text = choice.get("text")
        if text is None:
            text = (choice.get("message") or {}).get("content") or ""
        prompt_tokens = int(answer["usage"]["prompt_tokens"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineProtocolError(url, f"prefill answer lacks {exc}") from None
    return PrefillResult(request_id, str(text), prompt_tokens, params,
                         choice.get("finish_reason"))
