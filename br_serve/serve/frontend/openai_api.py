"""OpenAI-compatible request models and response shapes (completions and chat).

Every request field is honoured or refused with a 400 that names it; nothing is
silently ignored (the table "The OpenAI surface" in docs/serving.md lists each field,
what it does here and what vLLM's server does):

- types are strict: ``"max_tokens": "8"``, ``"stream": "yes"`` or ``true`` for a number
  are refused, never coerced;
- a field of vLLM's server that these engines cannot honour (:data:`REFUSED`) is
  accepted only at its neutral value (absent, ``null``, or the value that changes
  nothing, e.g. ``frequency_penalty: 0``); any other value is refused with the reason;
- an unknown field is refused (vLLM logs and ignores it).

:func:`parse_request` is the one entry point; it raises :class:`RequestError`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from br_serve.engine.base import SamplingParams
from br_serve.serve.frontend.stopping import OutputFilter

_STRICT = ConfigDict(extra="forbid", strict=True)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_STOPS = 64

#: Default ``max_tokens`` when a request gives none (vLLM: 16 for completions; for chat
#: the rest of the context, which here would mean an emulated stream of ~130k tokens).
DEFAULT_MAX_TOKENS = 16


class RequestError(ValueError):
    """A refused request: ``message`` starts with the field name, ``param`` is that field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


_NO_LOGPROBS = "the engines do not return token log-probabilities"
_NO_PENALTY = "the samplers apply no repetition penalties"
_NO_SAMPLER = "the samplers implement temperature, top_p and seed only"
_NO_GUIDED = "no structured output (guided decoding) here"
_NO_TOOLS = "no tool calling here (no tool parser)"

#: field -> (neutral values, why anything else is refused, endpoints: "c", "chat" or both).
#: ``None`` (or absence) is always neutral.
REFUSED: dict[str, tuple[tuple[Any, ...], str, str]] = {
    "n": ((1,), "one choice per request (send n requests)", "c,chat"),
    "best_of": ((1,), "one sequence per request", "c,chat"),
    "use_beam_search": ((False,), "no beam search", "c,chat"),
    "length_penalty": ((1, 1.0), "only beam search uses it", "c,chat"),
    "presence_penalty": ((0, 0.0), _NO_PENALTY, "c,chat"),
    "frequency_penalty": ((0, 0.0), _NO_PENALTY, "c,chat"),
    "repetition_penalty": ((1, 1.0), _NO_PENALTY, "c,chat"),
    "logit_bias": (({},), "no logit biasing", "c,chat"),
    "top_k": ((0, -1), _NO_SAMPLER, "c,chat"),
    "min_p": ((0, 0.0), _NO_SAMPLER, "c,chat"),
    "min_tokens": ((0,), "no EOS suppression below a minimum length", "c,chat"),
    "allowed_token_ids": ((), "no token restriction", "c,chat"),
    "bad_words": (([],), "no token restriction", "c,chat"),
    "logits_processors": (([],), "no custom logits processors", "c,chat"),
    "skip_special_tokens": ((True,), "special tokens are always skipped", "c,chat"),
    "spaces_between_special_tokens": ((True,), "special tokens are always skipped",
                                      "c,chat"),
    "truncate_prompt_tokens": ((), "prompts are never truncated", "c,chat"),
    "add_special_tokens": ((True,), "the engine adds its special tokens", "c,chat"),
    "prompt_logprobs": ((), _NO_LOGPROBS, "c,chat"),
    "return_tokens_as_token_ids": ((False,), _NO_LOGPROBS, "c,chat"),
    "response_format": (({"type": "text"},), _NO_GUIDED, "c,chat"),
    "guided_json": ((), _NO_GUIDED, "c,chat"),
    "guided_regex": ((), _NO_GUIDED, "c,chat"),
    "guided_choice": ((), _NO_GUIDED, "c,chat"),
    "guided_grammar": ((), _NO_GUIDED, "c,chat"),
    "guided_decoding_backend": ((), _NO_GUIDED, "c,chat"),
    "guided_whitespace_pattern": ((), _NO_GUIDED, "c,chat"),
    "structural_tag": ((), _NO_GUIDED, "c,chat"),
    "structured_outputs": ((), _NO_GUIDED, "c,chat"),
    "priority": ((0,), "the pool's policy orders requests, not a priority", "c,chat"),
    "kv_transfer_params": ((), "KV moves inside the graph", "c,chat"),
    "vllm_xargs": (({},), "no extension arguments", "c,chat"),
    "mm_processor_kwargs": (({},), "text only", "c,chat"),
    # completions only
    "logprobs": ((), _NO_LOGPROBS, "c"),
    "suffix": ((), "no fill-in-the-middle", "c"),
    "prompt_embeds": ((), "token ids or text only", "c"),
    # chat only
    "chat_logprobs": ((False,), _NO_LOGPROBS, "chat"),  # chat's ``logprobs`` (a bool)
    "top_logprobs": ((0,), _NO_LOGPROBS, "chat"),
    "tools": (([],), _NO_TOOLS, "chat"),
    "tool_choice": (("none",), _NO_TOOLS, "chat"),
    "functions": (([],), _NO_TOOLS, "chat"),
    "function_call": (("none",), _NO_TOOLS, "chat"),
    "reasoning_effort": ((), "no reasoning models here", "chat"),
    "echo": ((False,), "no continuation of the last assistant message", "chat"),
    "add_generation_prompt": ((True,), "the plain-text template always ends with "
                              "'assistant:'", "chat"),
    "continue_final_message": ((False,), "the plain-text template always ends with "
                               "'assistant:'", "chat"),
    "documents": ((), "no retrieval templates", "chat"),
    "chat_template": ((), "one fixed plain-text template", "chat"),
    "chat_template_kwargs": (({},), "one fixed plain-text template", "chat"),
}


def _neutral(value: Any, neutrals: tuple[Any, ...]) -> bool:
    # type(...) is ...: False == 0 and 1.0 == True in Python, not here
    return value is None or any(type(value) is type(n) and value == n for n in neutrals)


def _refuse_unsupported(data: dict[str, Any], chat: bool) -> dict[str, Any]:
    """``data`` without the :data:`REFUSED` fields, which must all be neutral."""
    where = "chat" if chat else "c"
    out = dict(data)
    for key in list(out):
        table_key = "chat_logprobs" if chat and key == "logprobs" else key
        entry = REFUSED.get(table_key)
        if entry is None or where not in entry[2].split(","):
            continue
        neutrals, why = entry[0], entry[1]
        if not _neutral(out.pop(key), neutrals):
            allowed = " or ".join(["null", *(repr(n) for n in neutrals)])
            raise RequestError(f"{key}: not supported here ({why}); only {allowed} is "
                               "accepted", key)
    return out


def _token_ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(t) is int for t in value):
        raise ValueError(f"{what} must be a list of integers")
    bad = [t for t in value if t < 0]
    if bad:
        raise ValueError(f"token ids must be >= 0 (got {bad[0]})")
    return value


class StreamOptions(BaseModel):
    """``include_usage`` (vLLM's default: true once ``stream_options`` is given) adds a
    usage-only chunk before ``[DONE]``; ``continuous_usage_stats`` puts usage in every
    chunk."""

    model_config = _STRICT
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _Common(BaseModel):
    model_config = _STRICT

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=_INT64_MIN, le=_INT64_MAX)
    stop: Any = Field(default=None, validate_default=True)
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    user: str | None = None
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    cache_salt: str | None = Field(default=None, min_length=1)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        stops = [v] if isinstance(v, str) else v
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("must be a string or a list of strings")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > _MAX_STOPS:
            raise ValueError(f"at most {_MAX_STOPS} stop strings")
        return tuple(stops)

    def check(self) -> None:
        """Cross-field rules (vLLM's): ``stream_options`` only with ``stream``."""
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options: only allowed with stream=true",
                               "stream_options")

    def max_new_tokens(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS

    def sampling(self) -> SamplingParams:
        """Engine parameters. Stop strings and ids stay at the ingress
        (:meth:`output_filter`), so every engine stops the same way."""
        return SamplingParams(
            max_tokens=self.max_new_tokens(),
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed, ignore_eos=self.ignore_eos)

    def output_filter(self) -> OutputFilter:
        return OutputFilter(self.stop, self.stop_token_ids or (),
                            self.include_stop_str_in_output, prefix=self.echo_prefix())

    def echo_prefix(self) -> str:
        return ""

    def stream_usage(self) -> tuple[bool, bool]:
        """``(usage-only chunk at the end, usage in every chunk)``."""
        so = self.stream_options
        if so is None:
            return False, False
        return bool(so.include_usage), bool(so.continuous_usage_stats)


class CompletionRequest(_Common):
    prompt: Any
    echo: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("must be a string, a list of token ids, or a one-element "
                             "list of either")
        if not v:
            raise ValueError("must not be empty")
        if all(isinstance(p, str | list) for p in v):  # a batch of prompts
            if len(v) != 1:
                raise ValueError(f"one prompt per request here (got a batch of {len(v)}); "
                                 "send one request per prompt")
            return v[0] if isinstance(v[0], str) else _token_ids(v[0], "a prompt")
        return _token_ids(v, "a token-id prompt")

    def check(self) -> None:
        super().check()
        if self.echo and not isinstance(self.prompt, str):
            raise RequestError("echo: needs a text prompt here (the ingress has no "
                               "tokenizer to turn token ids back into text)", "echo")

    def prompt_value(self) -> str | list[int]:
        p: str | list[int] = self.prompt
        return p

    def echo_prefix(self) -> str:
        return str(self.prompt) if self.echo else ""


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Any = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: Any) -> str | None:
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("must be a string or a list of text parts")
        texts = []
        for i, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"part {i}: only {{'type': 'text', 'text': ...}} parts are "
                                 f"supported (got {kind!r}; text only here)")
            if set(part) != {"type", "text"} or not isinstance(part["text"], str):
                raise ValueError(f"part {i}: a text part is exactly "
                                 "{'type': 'text', 'text': <string>}")
            texts.append(part["text"])
        return "\n".join(texts)

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, v: list[Any] | None) -> list[Any] | None:
        if v:
            raise ValueError(f"not supported here ({_NO_TOOLS})")
        return v

    def text(self) -> str:
        return str(self.content or "")


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None  # no tools, so nothing to parallelise
    include_reasoning: bool = True  # no reasoning parser: there is never reasoning text

    def max_new_tokens(self) -> int:
        # vLLM: max_completion_tokens wins over the deprecated max_tokens
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    def prompt_value(self) -> str:
        """A plain-text chat template (the emulated tokenizer counts its words)."""
        lines = [f"{m.role}{f' ({m.name})' if m.name else ''}: {m.text()}"
                 for m in self.messages]
        return "\n".join(lines) + "\nassistant:"


def _describe(exc: ValidationError) -> RequestError:
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field; this server refuses fields it does not implement"
    elif err["type"] == "missing":
        msg = "required"
    return RequestError(f"{param}: {msg}" if param else msg, param)


def parse_request(data: Any, chat: bool) -> CompletionRequest | ChatRequest:
    """Validate one request body (a parsed JSON value).

    Raises:
        RequestError: the first problem, naming its field.
    """
    if not isinstance(data, dict):
        raise RequestError("body: must be a JSON object", None)
    body = _refuse_unsupported(data, chat)
    try:
        req: CompletionRequest | ChatRequest = (
            ChatRequest.model_validate(body) if chat
            else CompletionRequest.model_validate(body))
    except ValidationError as exc:
        raise _describe(exc) from None
    req.check()
    return req


# -- responses -------------------------------------------------------------------------
def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish: str | None, use: dict[str, int],
                    chat: bool, stop_reason: str | int | None = None) -> dict[str, Any]:
    """A non-streamed response; ``stop_reason`` (vLLM's extension) is the stop string or
    token id that ended it, else null."""
    created = int(time.time())
    if chat:
        return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                             "stop_reason": stop_reason,
                             "message": {"role": "assistant", "content": text}}],
                "usage": use}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish,
                         "logprobs": None, "stop_reason": stop_reason}], "usage": use}


def chunk_body(rid: str, model: str, text: str | None, finish: str | None, chat: bool,
               first: bool = False, use: dict[str, int] | None = None,
               empty_choices: bool = False,
               stop_reason: str | int | None = None) -> dict[str, Any]:
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model}
    if empty_choices:
        body["choices"] = []
    elif chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish,
                            "logprobs": None, "stop_reason": stop_reason}]
    else:
        body["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish,
                            "logprobs": None, "stop_reason": stop_reason}]
    if use is not None:
        body["usage"] = use
    return body
