"""What the pool carries for a request prefilled on a remote engine (pure).

With a remote PD engine the KV stays on the prefill server; the graph moves only the
means to fetch it: a :class:`RemoteTicket` (the engine's transfer parameters, or the
SGLang room, plus the decode call's body). It travels inside a
:class:`~br_serve.transport.base.KVHandle` of the ``remote`` transport, and its
release on the engine (``cancel`` / ``abort_request``) is that transport's ``release``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from typing import Protocol as _Proto

from br_serve.remote.requests import (
    Bootstrap,
    sglang_decode_request,
    vllm_decode_request,
)

Protocol = Literal["vllm", "sglang"]


class Sampling(_Proto):
    """What :func:`completion_body` reads (``br_serve.engine.base.SamplingParams``;
    not imported: transports, which carry tickets, sit below the engines)."""

    @property
    def max_tokens(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def stop(self) -> tuple[str, ...]: ...
    @property
    def ignore_eos(self) -> bool: ...


def completion_body(prompt: str | list[int], params: Sampling,
                    model: str) -> dict[str, Any]:
    """The ``/v1/completions`` body for ``prompt`` with ``params`` (OpenAI fields the
    engines honour; ``max_tokens`` counts every generated token)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt,
                            "max_tokens": params.max_tokens,
                            "temperature": params.temperature, "top_p": params.top_p}
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.ignore_eos:
        body["ignore_eos"] = True
    return body


def estimate_prompt_tokens(prompt: str | list[int]) -> int:
    """A prompt's length before the engine counted it (SGLang answers the prefill only
    after the KV moved): exact for token ids, whitespace words for text."""
    if isinstance(prompt, list):
        return len(prompt)
    return max(len(prompt.split()), 1)


@dataclass(frozen=True, slots=True)
class RemoteTicket:
    """One prefilled request on a remote engine.

    ``request_id``: the id the prefill call carried (``X-Request-Id`` / ``rid``), which
    ``cancel`` / ``abort_request`` name. ``kv_transfer_params`` (vLLM) or
    ``bootstrap`` (SGLang) says where the decode finds the KV; a vLLM ticket without
    parameters is a prompt-keyed connector's (``remote.kv_handoff`` ``prompt``): the
    decode call is the same prompt, and nothing is held to release. ``prompt_tokens`` is the
    engine's count (vLLM) or an estimate (SGLang, corrected from the decode stream).
    """

    protocol: Protocol
    prefill_url: str
    request_id: str
    body: dict[str, Any]
    prompt_tokens: int
    kv_transfer_params: dict[str, Any] | None = None
    bootstrap: Bootstrap | None = None
    prefill_rank: int | None = field(default=None)

    def __post_init__(self) -> None:
        if self.protocol == "sglang" and self.bootstrap is None:
            raise ValueError("ticket: an SGLang ticket needs a bootstrap")

    def decode_call(self, decode_id: str,
                    rank: int | None) -> tuple[dict[str, Any], dict[str, str]]:
        """``(body, headers)`` of the streamed decode call on DP rank ``rank``."""
        if self.protocol == "vllm":
            return vllm_decode_request(self.body, self.kv_transfer_params, decode_id, rank)
        assert self.bootstrap is not None
        return sglang_decode_request(self.body, self.bootstrap, decode_id, rank), {}

    @property
    def prompt_keyed(self) -> bool:
        """A prompt-keyed connector's ticket: the prefill holds nothing to release."""
        return self.protocol == "vllm" and self.kv_transfer_params is None

    def release_call(self) -> tuple[str, dict[str, Any] | None]:
        """``(url, json body)`` of the call that frees the prefill's hold."""
        if self.protocol == "vllm":
            return f"{self.prefill_url}/v1/requests/{self.request_id}/cancel", None
        return f"{self.prefill_url}/abort_request", {"rid": self.request_id}
