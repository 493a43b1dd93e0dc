"""The emulated engine: time from the calibrated step model, KV as opaque bytes.

It implements both :class:`~br_serve.engine.base.PrefillEngine` and
:class:`~br_serve.engine.base.DecodeEngine`, runs anywhere and lets one laptop host
many decode replicas.

Contracts:
- Tokenizer: whitespace words of a string prompt, or the length of a token-id list
  (ids must lie in ``0 .. vocab_size - 1``).
- Tokens are a pure function of ``(seed, position)`` (``position`` counts prompt tokens
  first), like a greedy model whose output depends only on its context: re-prefilling a
  prompt extended by the tokens already produced continues the same sequence. The seed
  is ``params.seed`` or, when absent, a stable hash of the request id.
- KV payload: a ``uint8`` array of ``kv_bytes_per_token * prompt_tokens`` bytes;
  ``admit`` checks the size (a wrong size means the transport lost data).
- Output length is ``params.max_tokens`` (EOS never happens), counting the first token
  that prefill returns. Load of a request: ``prompt + decode steps run so far``.
- ``step`` sleeps ``slowdown * (a * load + c * running + b)`` for this replica alone: the caller
  then joins the barrier, so the slowest replica sets the step, as on real hardware.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from br_serve.core.step import StepModel
from br_serve.engine.base import (
    Engine,
    EngineCapabilities,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)

_MASK64 = (1 << 64) - 1


def token_id(seed: int, position: int, vocab_size: int = 32000) -> int:
    """Deterministic token at ``position`` for ``seed`` (splitmix64 of both)."""
    z = ((seed & _MASK64) * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return int((z ^ (z >> 31)) % vocab_size)


def token_text(tid: int) -> str:
    """One whitespace word per token, so re-tokenising generated text counts it exactly."""
    return f" t{tid}"


def request_seed(request_id: str, params: SamplingParams) -> int:
    return params.seed if params.seed is not None else zlib.crc32(request_id.encode())


@dataclass(slots=True)
class _EmulatedRequest:
    seed: int
    prompt_tokens: int
    generated: int  # tokens produced so far, the prefill token included
    max_tokens: int


class EmulatedEngine(Engine):
    """Prefill + decode emulation; not thread-safe (the owning actor serialises calls).

    Raises:
        ValueError: empty prompt; admitting an id twice or a KV payload of the wrong
            size; ``max_tokens < 1``.
    """

    #: nothing beyond the base contract: its step never waits, a request fails only
    #: through ``step``
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()

    name = "emulated"

    def __init__(self, kv_bytes_per_token: int = 16, step: StepModel | None = None,
                 slowdown: float = 1.0,
                 prefill_p0_s: float = 0.0, prefill_p1_s_per_token: float = 0.0,
                 vocab_size: int = 32000,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.kv_bytes_per_token = kv_bytes_per_token
        self.step_model = step or StepModel()
        a, b, c = self.step_model.scalar()
        self.step_a_s_per_token, self.step_b_s, self.step_c_s_per_request = a, b, c
        self.slowdown = slowdown
        self.prefill_p0_s = prefill_p0_s
        self.prefill_p1_s_per_token = prefill_p1_s_per_token
        self.vocab_size = vocab_size
        self._sleep = sleep
        self._running: dict[str, _EmulatedRequest] = {}

    # -- prefill -------------------------------------------------------------------
    def count_tokens(self, prompt: str | list[int]) -> int:
        """Whitespace words, or the number of token ids.

        Raises:
            ValueError: a token id outside ``0 .. vocab_size - 1`` (as a real engine).
        """
        if isinstance(prompt, str):
            return len(prompt.split())
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt: token id {bad} is outside the vocabulary "
                             f"(0..{self.vocab_size - 1})")
        return len(prompt)

    def prefill(self, request_id: str, prompt: str | list[int],
                params: SamplingParams) -> PrefillResult:
        s = self.count_tokens(prompt)
        if s < 1:
            raise ValueError("prompt: must contain at least one token")
        if params.max_tokens < 1:
            raise ValueError("max_tokens: must be >= 1")
        delay = self.slowdown * (self.prefill_p0_s + self.prefill_p1_s_per_token * s)
        if delay > 0:
            self._sleep(delay)
        seed = request_seed(request_id, params)
        tid = token_id(seed, s, self.vocab_size)
        kv = np.full(self.kv_bytes_per_token * s, s % 251, dtype=np.uint8)
        done = params.max_tokens == 1
        return PrefillResult(request_id=request_id, prompt_tokens=s, first_token_id=tid,
                             first_token_text=token_text(tid), kv=kv, finished=done,
                             finish_reason="length" if done else None)

    # -- decode --------------------------------------------------------------------
    def admit(self, request_id: str, kv: Any, prompt_tokens: int, first_token_id: int,
              params: SamplingParams) -> None:
        if request_id in self._running:
            raise ValueError(f"request_id: {request_id!r} already admitted")
        want = self.kv_bytes_per_token * prompt_tokens
        got = int(getattr(kv, "nbytes", len(kv)))
        if got != want:
            raise ValueError(f"kv: {got} bytes for {prompt_tokens} tokens, expected {want}")
        if params.max_tokens < 1:
            raise ValueError("max_tokens: must be >= 1")
        self._running[request_id] = _EmulatedRequest(request_seed(request_id, params),
                                                     prompt_tokens, 1, params.max_tokens)

    def step_time_s(self) -> float:
        """Modelled compute time of the next step for this replica alone (scaled)."""
        return self.slowdown * (self.step_a_s_per_token * self.load_tokens()
                                  + self.step_c_s_per_request * len(self._running)
                                  + self.step_b_s)

    def step(self) -> list[TokenEvent]:
        delay = self.step_time_s()
        if delay > 0:
            self._sleep(delay)
        events: list[TokenEvent] = []
        done: list[str] = []
        for rid, r in self._running.items():
            idx = r.generated
            tid = token_id(r.seed, r.prompt_tokens + idx, self.vocab_size)
            r.generated += 1
            fin = r.generated >= r.max_tokens
            events.append(TokenEvent(rid, tid, token_text(tid), idx, fin,
                                     "length" if fin else None))
            if fin:
                done.append(rid)
        for rid in done:
            del self._running[rid]
        return events

    def abort(self, request_id: str) -> None:
        self._running.pop(request_id, None)

    def load_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated - 1 for r in self._running.values())

    def running(self) -> int:
        return len(self._running)

    def decoded_steps(self, request_id: str) -> int:
        """Decode steps run for ``request_id`` (its load is ``prompt + this``)."""
        return self._running[request_id].generated - 1

    def prompt_tokens_of(self, request_id: str) -> int:
        return self._running[request_id].prompt_tokens

    def running_ids(self) -> list[str]:
        return list(self._running)
