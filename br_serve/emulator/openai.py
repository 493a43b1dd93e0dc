"""OpenAI-compatible request parsing and response shapes shared by both protocols.

A known field with a value the emulator cannot honour (``n > 1``, ``logprobs``,
``echo``, a non-empty ``stop``) is refused by name with :class:`ApiError` (HTTP 400).
A field it does not know is accepted and reported in ``ParsedRequest.ignored_fields``
(the engines accept and ignore unknown fields), or, with ``strict``, refused by name. Sampling
fields that only shape real sampling (``temperature``, ``top_p``, ...) are accepted and
have no effect: the emulator's tokens are a pure function of the seed and the prompt.

Tokenizer: whitespace words of a string prompt, or the length of a token-id list; a
chat request is rendered as ``"role: content"`` lines plus ``"assistant:"``. The seed
is the request's ``seed`` or, when absent, the CRC-32 of the rendered prompt, so the
same request always yields the same text.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               409: "ConflictError", 500: "InternalServerError", 502: "BadGatewayError",
               503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}


class ApiError(Exception):
    """An HTTP error in the engine's own error shape (the protocol module formats it)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or ERROR_TYPES.get(status, "InternalServerError")


#: Accepted, modelled fields of both endpoints.
_COMMON = frozenset({"model", "max_tokens", "stream", "stream_options", "seed", "n",
                     "logprobs", "stop", "user", "temperature", "top_p", "top_k", "min_p",
                     "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "ignore_eos", "min_tokens", "skip_special_tokens"})
_COMPLETION = _COMMON | {"prompt", "echo"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "min_completion_tokens",
                   "top_logprobs"}


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated completion or chat request."""

    chat: bool
    prompt_tokens: int
    max_tokens: int
    seed: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    model: str
    #: request fields neither OpenAI's nor the protocol's, accepted and ignored
    ignored_fields: tuple[str, ...] = ()


def parse_request(body: Any, chat: bool, extra_fields: frozenset[str], strict: bool,
                  served_model: str, check_model: bool) -> ParsedRequest:
    """Validate an OpenAI completion (``chat=False``) or chat request body.

    ``extra_fields`` are the protocol's own fields (checked by its module).

    Raises:
        ApiError: 400 naming the bad field; 404 for a model this server does not serve.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    allowed = (_CHAT if chat else _COMPLETION) | extra_fields
    ignored = tuple(sorted(k for k in body if k not in allowed))
    if strict and ignored:
        raise ApiError(400, f"{ignored[0]}: field not supported by the engine emulator "
                            "(it runs with --strict-fields; without it the field is "
                            "ignored, as the engines do)", param=ignored[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model: must be a string", "model")
    if check_model and model not in (None, served_model):
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    if chat:
        prompt_tokens, text = _chat_prompt(body.get("messages"))
    else:
        prompt_tokens, text = _completion_prompt(body.get("prompt"))
    max_tokens = _max_tokens(body, chat)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ApiError(400, "seed: must be an integer", "seed")
    if seed is None:
        seed = zlib.crc32(text.encode())
    stream = _bool(body, "stream", False)
    include_usage, continuous = _stream_options(body.get("stream_options"), stream)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise ApiError(400, "n: the engine emulator returns one choice (n must be 1)", "n")
    if body.get("logprobs") not in (None, False, 0):
        raise ApiError(400, "logprobs: not modelled by the engine emulator", "logprobs")
    if body.get("echo"):
        raise ApiError(400, "echo: not modelled by the engine emulator", "echo")
    if body.get("stop") not in (None, [], ""):
        raise ApiError(400, "stop: stop strings are not modelled by the engine emulator "
                            "(its outputs always run to max_tokens)", "stop")
    min_tokens = body.get("min_tokens", 0) or 0
    if not isinstance(min_tokens, int) or not 0 <= min_tokens <= max_tokens:
        raise ApiError(400, f"min_tokens: must be an integer in [0, max_tokens={max_tokens}]",
                       "min_tokens")
    return ParsedRequest(chat, prompt_tokens, max_tokens, int(seed), stream, include_usage,
                         continuous, model or served_model, ignored)


def _completion_prompt(prompt: Any) -> tuple[int, str]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        n = len(prompt.split())
        text = prompt
    elif (isinstance(prompt, list) and prompt
          and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)):
        n = len(prompt)
        text = " ".join(map(str, prompt))
    else:
        raise ApiError(400, "prompt: must be a non-empty string, one string in a list, or "
                            "a list of token ids", "prompt")
    if n < 1:
        raise ApiError(400, "prompt: must contain at least one token", "prompt")
    return n, text


def _chat_prompt(messages: Any) -> tuple[int, str]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: must be a non-empty list", "messages")
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages.{i}: needs a string role", f"messages.{i}")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        elif content is not None and not isinstance(content, str):
            raise ApiError(400, f"messages.{i}.content: must be a string or a list of parts",
                           f"messages.{i}.content")
        lines.append(f"{m['role']}: {content or ''}")
    text = "\n".join(lines) + "\nassistant:"
    return len(text.split()), text


def _max_tokens(body: Mapping[str, Any], chat: bool) -> int:
    value = body.get("max_tokens")
    name = "max_tokens"
    if value is None and chat and body.get("max_completion_tokens") is not None:
        value, name = body["max_completion_tokens"], "max_completion_tokens"
    if value is None:
        return 16
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"{name}: must be an integer >= 1", name)
    return value


#: the strings pydantic's lax mode (both engines' request models) reads as booleans
_BOOL_STRINGS = {"1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
                 "0": False, "off": False, "f": False, "false": False, "n": False,
                 "no": False}


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean field as the engines read it: ``true``/``false``, 0/1, or one of
    pydantic's boolean strings (``"yes"``, ``"off"``, ...; the real vLLM streams for
    ``"stream": "yes"``); anything else is refused by name."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _BOOL_STRINGS:
        return _BOOL_STRINGS[value.lower()]
    raise ApiError(400, f"{name}: must be a boolean", name)


def _stream_options(opts: Any, stream: bool) -> tuple[bool, bool]:
    if opts is None:
        return False, False
    if not isinstance(opts, dict):
        raise ApiError(400, "stream_options: must be an object", "stream_options")
    if not stream:
        raise ApiError(400, "stream_options: Stream options can only be defined when "
                            "`stream=True`.", "stream_options")
    for key in opts:
        if key not in ("include_usage", "continuous_usage_stats"):
            raise ApiError(400, f"stream_options.{key}: unknown option",
                           f"stream_options.{key}")
    include = _bool(opts, "include_usage", False)
    continuous = _bool(opts, "continuous_usage_stats", False)
    return include, include and continuous


# -- response shapes ---------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, req: ParsedRequest, text: str, n_tokens: int,
                    choice_extra: Mapping[str, Any], **top: Any) -> dict[str, Any]:
    """A non-streamed completion or chat completion, finish reason ``length``."""
    created = int(time.time())
    if req.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                          "content": text},
                                  "logprobs": None, "finish_reason": "length"}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        obj = "text_completion"
    choice.update(choice_extra)
    return {"id": rid, "object": obj, "created": created, "model": req.model,
            "choices": [choice], "usage": usage(req.prompt_tokens, n_tokens), **top}


class ChunkWriter:
    """Formats the SSE chunks of one stream: ``data: <json>\\n\\n`` ... ``data: [DONE]``.

    A token chunk is assembled from pre-encoded pieces (only the text is JSON-encoded
    per token): the same bytes ``json.dumps`` would give, at a tenth of the cost.
    """

    def __init__(self, rid: str, req: ParsedRequest, choice_extra: Mapping[str, Any]) -> None:
        self.rid = rid
        self.req = req
        self.extra = dict(choice_extra)
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if req.chat else "text_completion"
        head = json.dumps({"id": rid, "object": self.obj, "created": self.created,
                           "model": req.model}, separators=(",", ":"))[:-1]
        field = '{"content":' if req.chat else ""
        key = "delta" if req.chat else "text"
        self._head = f'data: {head},"choices":[{{"index":0,"{key}":{field}'.encode()
        extra = json.dumps(self.extra, separators=(",", ":"))[1:-1]
        tail = ',"logprobs":null,"finish_reason":'
        close = ("," + extra if extra else "") + '}],"usage":'
        self._mid = (("}" if req.chat else "") + tail).encode()
        self._close = close.encode()

    def _frame(self, choices: list[dict[str, Any]], use: dict[str, int] | None) -> bytes:
        body = {"id": self.rid, "object": self.obj, "created": self.created,
                "model": self.req.model, "choices": choices, "usage": use}
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes | None:
        """Chat streams open with an empty assistant delta (no token)."""
        if not self.req.chat:
            return None
        use = usage(self.req.prompt_tokens, 0) if self.req.continuous_usage else None
        return self._frame([{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None, **self.extra}], use)

    def token(self, text: str, emitted: int, finished: bool) -> bytes:
        if self.req.continuous_usage:
            p = self.req.prompt_tokens
            use = (f'{{"prompt_tokens":{p},"completion_tokens":{emitted},'
                   f'"total_tokens":{p + emitted}}}')
        else:
            use = "null"
        fin = b'"length"' if finished else b"null"
        return b"".join((self._head, json.dumps(text).encode(), self._mid, fin, self._close,
                         use.encode(), b"}\n\n"))

    def final_usage(self, emitted: int) -> bytes | None:
        if not self.req.include_usage:
            return None
        return self._frame([], usage(self.req.prompt_tokens, emitted))


DONE = b"data: [DONE]\n\n"


def sse_json(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
