"""Prefill on a remote PD engine (``engine=vllm|sglang``): call the engine and hand the
pool a ticket instead of KV bytes. :class:`RemotePrefiller` is a plain object that each
ingress replica owns and calls in its own event loop (no Prefill deployment stands
between the ingress and a remote engine: that round trip cost 10-20 ms of a loaded core
per request).

- vLLM / vllm-ascend: ``max_tokens: 1`` with ``kv_transfer_params`` asking for a
  remote decode; the answer's parameters (and the engine's prompt count) go into a
  :class:`~br_serve.remote.ticket.RemoteTicket`. The prefill server holds the KV until
  the decode pulls it. A prompt-keyed connector (``remote.kv_handoff`` ``prompt``, or
  ``auto`` and an answer with ``kv_transfer_params: null``) gives a ticket without
  parameters: the decode call is the same prompt, which the connector's store finds.
- SGLang: the request carries a fresh ``bootstrap_room``; SGLang answers it only once
  the decode took the KV, so the call runs on as a task of the caller's loop and the ticket
  is returned at once (after a short wait that catches an immediate refusal). The
  prompt length is an estimate until the decode stream reports the engine's count.

The ticket comes back unheld: its owner (the ingress) hands it to the KV keeper
(``remote`` transport) without waiting (``KVLease.hold_soon``), and the keeper holds it
until a decode replica takes it or it is released; a release, or ``pool_ttl_s`` in the
pool, frees the hold on the engine (``cancel`` / ``abort_request``). Errors come back as a
:class:`PrefillOutput` ``error``: the engine's 400 as a 400 (its message passed on),
an engine down, timing out or failing (5xx) as a 503 (the ingress retries), any other
answer as a 502. The constructor checks each prefill URL's ``/health`` and raises
naming the one that does not answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import uuid
from typing import TYPE_CHECKING, Any

from br_serve.engine.base import SamplingParams
from br_serve.engine.remote_spec import split_url
from br_serve.serve.prefill.worker import over_context
from br_serve.serve.wire.messages import PrefillOutput

if TYPE_CHECKING:
    from br_serve.serve.config import GraphConfig

log = logging.getLogger(__name__)

#: how long an SGLang prefill call is watched for an immediate refusal
_SGLANG_REFUSAL_WAIT_S = 0.05


def check_endpoints(urls: tuple[str, ...], field: str, timeout_s: float,
                    api_key: str | None = None) -> None:
    """Raise ``RuntimeError`` naming ``field[i]`` for the first URL whose ``/health``
    does not answer 200 (blocking)."""
    import httpx

    from br_serve.remote.requests import bearer

    with httpx.Client(timeout=timeout_s, headers=bearer(api_key)) as http:
        for i, url in enumerate(urls):
            try:
                r = http.get(f"{url}/health")
            except httpx.HTTPError as exc:
                raise RuntimeError(f"{field}[{i}] {url}: cannot reach the engine "
                                   f"({type(exc).__name__}: {exc})") from None
            if r.status_code != 200:
                raise RuntimeError(f"{field}[{i}] {url}: /health answered "
                                   f"{r.status_code} {r.text[:200]!r}")


class RemotePrefiller:
    """Prefill calls to remote prefill servers, made in the caller's event loop (the
    ingress replica's). The constructor blocks (the ``/health`` checks)."""

    def __init__(self, cfg: GraphConfig) -> None:
        from br_serve.remote.client import Timeouts
        from br_serve.transport.factory import make_transport

        self.cfg = cfg
        remote = cfg.remote
        check_endpoints(remote.prefill_urls, "remote.prefill_urls", remote.connect_s * 2,
                        remote.api_key)
        self.protocol = cfg.engine.name
        self.model = remote.model or cfg.serve.model
        self._tickets = make_transport("remote", api_key=remote.api_key)
        self._timeouts = Timeouts(connect_s=remote.connect_s,
                                  request_s=remote.first_token_s,
                                  first_byte_s=remote.first_token_s,
                                  stall_s=remote.stall_s,
                                  keepalive_s=remote.keepalive_s)
        self._client: Any = None  # made on the serving loop
        # round robin from a random start, so that ingress replicas do not march in step
        self._next = itertools.count(random.Random(uuid.uuid4().int).randrange(1 << 16))
        # SGLang rooms must be unique across every caller of every graph: a seed
        # shared by ingress replicas would repeat them, so each draws from its own
        self._rooms = random.Random(uuid.uuid4().int)
        self._calls: set[asyncio.Task[Any]] = set()

    def _http(self) -> Any:
        if self._client is None:
            from br_serve.remote.client import RemoteEngineClient

            self._client = RemoteEngineClient(self._timeouts, api_key=self.cfg.remote.api_key)
        return self._client

    async def prefill(self, request_id: str, prompt: str | list[int],
                      params: SamplingParams) -> PrefillOutput:
        from br_serve.remote.errors import (
            EngineHTTPError,
            EngineProtocolError,
            RemoteEngineError,
        )

        if not prompt:
            return PrefillOutput(request_id, error="prompt: must not be empty",
                                 error_status=400)
        urls = self.cfg.remote.prefill_urls
        url = urls[next(self._next) % len(urls)]
        try:
            if self.protocol == "vllm":
                ticket = await self._vllm(url, request_id, prompt, params)
            else:
                ticket = await self._sglang(url, request_id, prompt, params)
        except EngineHTTPError as exc:
            status = 400 if exc.status == 400 else 503 if exc.retryable else 502
            message = exc.error.message if exc.error is not None else str(exc)
            return PrefillOutput(request_id, error=f"prefill engine {url}: {message}",
                                 error_status=status)
        except RemoteEngineError as exc:  # down, timed out, disconnected, bad answer
            status = 502 if isinstance(exc, EngineProtocolError) else 503
            return PrefillOutput(request_id, error=f"prefill engine: {exc}",
                                 error_status=status)
        if isinstance(ticket, PrefillOutput):
            return ticket
        handle = self._tickets.put(request_id, ticket)  # inline: nothing is stored
        return PrefillOutput(request_id, prompt_tokens=ticket.prompt_tokens,
                             first_token_id=-1, kv=handle, first_token_pending=True)

    async def _vllm(self, url: str, request_id: str, prompt: str | list[int],
                    params: SamplingParams) -> Any:
        from br_serve.remote.ticket import RemoteTicket, completion_body

        body = completion_body(prompt, params, self.model)
        res = await self._http().vllm_prefill(url, body, request_id,
                                              kv_handoff=self.cfg.remote.kv_handoff)
        return RemoteTicket("vllm", url, request_id, body, res.prompt_tokens,
                            kv_transfer_params=res.kv_transfer_params)

    async def _sglang(self, url: str, request_id: str, prompt: str | list[int],
                      params: SamplingParams) -> Any:
        from br_serve.remote.requests import Bootstrap, new_bootstrap_room
        from br_serve.remote.ticket import RemoteTicket, completion_body, estimate_prompt_tokens

        n = estimate_prompt_tokens(prompt)
        refused = over_context(request_id, n, params.max_tokens,
                               self.cfg.context_limit_tokens(), estimated=True)
        if refused is not None:
            return refused
        host, port = split_url(url)
        boot = Bootstrap(host, self.cfg.remote.bootstrap_port or port,
                         new_bootstrap_room(self._rooms))
        body = completion_body(prompt, params, self.model)
        # the decode this ticket is bound to waits for the room's KV, which only this
        # call brings: the client sends it again if its connection is lost unanswered
        call = asyncio.create_task(self._http().sglang_prefill(
            url, body, boot, request_id,
            timeout_s=self.cfg.pool.ttl_s + self.cfg.remote.first_token_s))
        try:
            done, _ = await asyncio.wait({call}, timeout=_SGLANG_REFUSAL_WAIT_S)
        except asyncio.CancelledError:  # no ticket will name the room: free it now
            call.cancel()  # (the engine aborts a request whose connection closes)
            raise
        if done:  # answered at once: a refusal (a success needs its decode first)
            from br_serve.remote.errors import EngineProtocolError

            call.result()  # raises the engine's error
            raise EngineProtocolError(url, "the SGLang prefill answered before any decode "
                                           "took its KV (is it started with "
                                           "--disaggregation-mode prefill?)")
        self._calls.add(call)
        call.add_done_callback(self._call_ended)
        return RemoteTicket("sglang", url, request_id, body, n, bootstrap=boot)

    def _call_ended(self, call: asyncio.Task[Any]) -> None:
        self._calls.discard(call)
        if call.cancelled() or call.exception() is None:
            return
        from br_serve.remote.errors import EngineHTTPError

        exc = call.exception()
        if isinstance(exc, EngineHTTPError):
            # the engine's answer: the request was released (abort) or its decode failed
            log.debug("prefill: SGLang prefill call ended: %s", exc)
        else:  # its decode waits for KV that will not come, until its first-token bound
            log.warning("prefill: SGLang prefill call failed: %s", exc)
