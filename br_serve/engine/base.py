"""The engine interface: what a prefill worker and a decode replica need from a model.

Two implementations: the emulated engine (step time from the calibrated model, KV as
opaque bytes) and the torch engine (a real causal LM on cpu / cuda / npu). The
serving layer only talks to this interface, so both run in the same Ray graph.

Contract of a decode engine, driven by one decode replica actor:
- ``admit`` installs a prefilled request (its KV payload, prompt length, first token);
- ``step`` runs one decode step for *every* admitted request and returns one
  :class:`TokenEvent` per request (``finished=True`` on its last token);
- ``abort`` drops a request at once; ``load_tokens`` is the replica's KV load
  ``sum(prompt + decoded)`` as the scheduler defines it;
- ``running_ids`` / ``prompt_tokens_of`` / ``decoded_steps`` describe each admitted
  request (its load is ``prompt_tokens_of + decoded_steps``); the decode replica reports
  them to the scheduler's mirror.
- ``capabilities`` (:class:`EngineCapabilities`) declares what an engine does beyond
  that contract; the replica calls :meth:`DecodeEngine.nudge` and
  :meth:`DecodeEngine.take_failures` only on an engine that declares them. Each engine
  class states its own (the base declares none).
Engines are not thread-safe; the owning actor serialises calls. ``admit`` raises
``ValueError`` for a request it cannot take (wrong KV size, duplicate id, bad params);
any other exception is a fault of the engine (the replica stops and is replaced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Decoding options of one request (OpenAI semantics).

    ``max_tokens`` counts every generated token including the first one that prefill
    produces. ``temperature == 0`` means greedy. ``stop`` strings end generation
    (finish_reason ``"stop"``); ``ignore_eos`` keeps generating past EOS.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """Output of prefill: the KV payload to move, the prompt length, the first token.

    ``kv`` is engine-specific (bytes-like for the emulated engine, a dict of named
    tensors for the torch engine); transports move it without interpreting it.
    """

    request_id: str
    prompt_tokens: int
    first_token_id: int
    first_token_text: str
    kv: Any
    finished: bool = False
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token of one request. ``index`` counts from 0 (the prefill token)."""

    request_id: str
    token_id: int
    text: str
    index: int
    finished: bool = False
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What a decode engine does beyond the base contract (all off by default).

    ``wakes_on_admit``: its ``step`` may wait for tokens from elsewhere (a remote rank
    does), and :meth:`DecodeEngine.nudge` ends that wait so that a new admission is
    installed now rather than at the next token. ``fails_streams``: a request can fail
    on its own, outside ``step``'s return value (a remote stream that breaks), and
    :meth:`DecodeEngine.take_failures` hands those failures over after each step.
    """

    wakes_on_admit: bool = False
    fails_streams: bool = False


class PrefillEngine(Protocol):
    def count_tokens(self, prompt: str | list[int]) -> int: ...

    def prefill(self, request_id: str, prompt: str | list[int],
                params: SamplingParams) -> PrefillResult: ...


class DecodeEngine(Protocol):
    #: what this engine does beyond the contract; each engine class states its own
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()

    def admit(self, request_id: str, kv: Any, prompt_tokens: int, first_token_id: int,
              params: SamplingParams) -> None: ...

    def step(self) -> list[TokenEvent]: ...

    def abort(self, request_id: str) -> None: ...

    def load_tokens(self) -> int: ...

    def running(self) -> int: ...

    def running_ids(self) -> list[str]: ...

    def prompt_tokens_of(self, request_id: str) -> int: ...

    def decoded_steps(self, request_id: str) -> int: ...

    def nudge(self) -> None:
        """End a ``step``'s wait for tokens now (``capabilities.wakes_on_admit``; the
        base's step never waits: nothing to do)."""
        return None

    def take_failures(self) -> list[tuple[str, str, bool]]:
        """``(request_id, message, retryable)`` of the requests that failed since the last
        call and no longer run here (``capabilities.fails_streams``; the base's requests
        fail only through ``step``: none)."""
        return []


class Engine(PrefillEngine, DecodeEngine, Protocol):
    """Both halves: what :func:`br_serve.engine.factory.make_engine` builds."""
