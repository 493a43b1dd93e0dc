"""Prefill deployment: prompt -> KV (put in the transport), prompt length, first token.

Runs as a Serve deployment with N replicas. Each call returns a :class:`PrefillOutput`;
bad input (empty prompt, a prompt the engine cannot encode, prompt + max_tokens over the
context limit) comes back as an ``error`` with the HTTP status the ingress should use
(400), not as an exception, so the ingress can answer without parsing remote
tracebacks. A KV keeper that cannot be reached, or a failed put, gives status 503 (the
ingress retries). The KV's lifetime after the reply is the :class:`KVLease`'s: the
keeper holds it until a decode replica or the ingress releases it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

from br_serve.engine.base import PrefillEngine, SamplingParams
from br_serve.serve.wire.messages import PrefillOutput
from br_serve.transport.base import TransportError
from br_serve.transport.lease import KVLease

if TYPE_CHECKING:
    from br_serve.serve.config import GraphConfig

log = logging.getLogger(__name__)


def over_context(request_id: str, prompt_tokens: int, max_tokens: int, limit: int,
                 estimated: bool = False) -> PrefillOutput | None:
    """The 400 for prompt + ``max_tokens`` over ``limit``, else None. It uses OpenAI's
    and vLLM's "maximum context length" wording, which clients look for to shorten the
    request; ``estimated``: the prompt length is an estimate (a remote engine counts)."""
    need = prompt_tokens + max_tokens
    if need <= limit:
        return None
    about = "about " if estimated else ""
    return PrefillOutput(
        request_id, prompt_tokens=prompt_tokens, error_status=400,
        error=(f"prompt: this model's maximum context length is {limit} tokens; the "
               f"request needs {about}{need} ({about}{prompt_tokens} prompt tokens + "
               f"max_tokens {max_tokens})"))


class PrefillWorker:
    """One prefill replica (wrapped by ``serve.deployment`` in :mod:`br_serve.serve.graph`)."""

    def __init__(self, cfg: GraphConfig) -> None:
        from br_serve.engine.factory import make_engine
        from br_serve.transport.factory import make_transport
        from br_serve.transport.keeper import get_keeper

        self.cfg = cfg
        self.engine: PrefillEngine = make_engine(cfg.engine, cfg.engine_timing(0),
                                                 cfg.slots, cfg.seed)
        self.lease = KVLease(make_transport(cfg.transport.name, cfg.transport.mooncake_master),
                             find_keeper=lambda: get_keeper(cfg.serve.app_name,
                                                            cfg.serve.namespace))
        # Engines are not thread-safe; prefill runs in a worker thread, one at a time
        # per replica (Serve spreads concurrent requests over the N replicas).
        self._lock = threading.Lock()

    async def prefill(self, request_id: str, prompt: str | list[int],
                      params: SamplingParams) -> PrefillOutput:
        out = await asyncio.to_thread(self._prefill, request_id, prompt, params)
        if out.kv is not None:
            try:
                await self.lease.hold(out.kv)  # keep it alive past this reply
            except TransportError as exc:
                log.warning("prefill: %s", exc)
                await asyncio.to_thread(self.lease.discard, out.kv)
                return PrefillOutput(request_id, error=f"kv keeper unavailable: {exc}",
                                     error_status=503)
        return out

    def _prefill(self, request_id: str, prompt: str | list[int],
                 params: SamplingParams) -> PrefillOutput:
        t0 = time.perf_counter()
        with self._lock:
            try:
                s = self.engine.count_tokens(prompt)
            except ValueError as exc:  # e.g. a token id outside the vocabulary
                return PrefillOutput(request_id, error=str(exc), error_status=400)
            if s < 1:
                return PrefillOutput(request_id, error="prompt: must not be empty",
                                     error_status=400)
            refused = over_context(request_id, s, params.max_tokens,
                                   self.cfg.context_limit_tokens())
            if refused is not None:
                return refused
            res = self.engine.prefill(request_id, prompt, params)
        try:
            handle = None if res.finished else self.lease.put(request_id, res.kv)
        except TransportError as exc:  # e.g. the store is full: retryable
            return PrefillOutput(request_id, prompt_tokens=s, error=f"kv put failed: {exc}",
                                 error_status=503)
        return PrefillOutput(
            request_id, prompt_tokens=res.prompt_tokens, first_token_id=res.first_token_id,
            first_token_text=res.first_token_text, finished=res.finished,
            finish_reason=res.finish_reason, kv=handle,
            prefill_s=time.perf_counter() - t0)
