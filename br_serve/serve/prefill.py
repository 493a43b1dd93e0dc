"""Prefill deployment: prompt -> KV (put in the transport), prompt length, first token.

Runs as a Serve deployment with N replicas. Each call returns a :class:`PrefillOutput`;
bad input (empty prompt, a prompt the engine cannot encode, prompt + max_tokens over the
context limit) comes back as an ``error`` with the HTTP status the ingress should use
(400), not as an exception, so the ingress can answer without parsing remote
tracebacks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from br_serve.engine.base import SamplingParams
from br_serve.serve.messages import PrefillOutput


class PrefillWorker:
    """One prefill replica (wrapped by ``serve.deployment`` in :mod:`br_serve.serve.graph`)."""

    def __init__(self, config: dict[str, Any]) -> None:
        from br_serve.engine.factory import make_engine, make_transport
        from br_serve.serve.config import parse_graph_config

        self.cfg = parse_graph_config(config)
        self.engine = make_engine(self.cfg, self.cfg.engine_timing(0), self.cfg.slots,
                                  self.cfg.seed)
        self.transport = make_transport(self.cfg.transport, self.cfg.mooncake_master)
        # Engines are not thread-safe; prefill runs in a worker thread, one at a time
        # per replica (Serve spreads concurrent requests over the N replicas).
        self._lock = threading.Lock()
        self._keeper: Any = None

    async def prefill(self, request_id: str, prompt: str | list[int],
                      params: SamplingParams) -> PrefillOutput:
        out = await asyncio.to_thread(self._prefill, request_id, prompt, params)
        if out.kv is not None and out.kv.ref is not None:
            # keep the object alive past this reply (see br_serve.serve.kvkeeper)
            if self._keeper is None:
                from br_serve.serve.kvkeeper import get_keeper

                self._keeper = await asyncio.to_thread(get_keeper, self.cfg.app_name,
                                                       self.cfg.namespace)
            await self._keeper.hold.remote(out.kv.key, [out.kv.ref])
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
            limit = self.cfg.max_context_tokens
            if s + params.max_tokens > limit:
                # 400 with OpenAI's and vLLM's "maximum context length" wording, which
                # clients look for to shorten the request
                return PrefillOutput(
                    request_id, prompt_tokens=s, error_status=400,
                    error=(f"prompt: this model's maximum context length is {limit} "
                           f"tokens; the request needs {s + params.max_tokens} ({s} prompt "
                           f"tokens + max_tokens {params.max_tokens})"))
            res = self.engine.prefill(request_id, prompt, params)
        handle = None if res.finished else self.transport.put(request_id, res.kv)
        return PrefillOutput(
            request_id, prompt_tokens=res.prompt_tokens, first_token_id=res.first_token_id,
            first_token_text=res.first_token_text, finished=res.finished,
            finish_reason=res.finish_reason, kv=handle,
            prefill_s=time.perf_counter() - t0)
