"""OpenAI-compatible request models and response shapes (completions and chat).

Request models validate at the edge: a wrong type or range becomes a 400 in OpenAI's
error shape naming the field. Unknown fields are ignored, as OpenAI-compatible
servers commonly do, so newer clients keep working.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from br_serve.engine.base import SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False

    def sampling(self, default_max_tokens: int = 16) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(max_tokens=self.max_tokens or default_max_tokens,
                              temperature=self.temperature, top_p=self.top_p,
                              seed=self.seed, stop=stop, ignore_eos=self.ignore_eos)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]

    def prompt_value(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise ValueError("prompt: only one prompt per request is supported")
            return str(p[0])
        return p  # type: ignore[return-value]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return " ".join(str(p.get("text", "")) for p in self.content)
        return self.content or ""


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def prompt_value(self) -> str:
        """A plain-text chat template (the emulated tokenizer counts its words)."""
        return "\n".join(f"{m.role}: {m.text()}" for m in self.messages) + "\nassistant:"

    def sampling(self, default_max_tokens: int = 16) -> SamplingParams:
        sp = super().sampling(default_max_tokens)
        if self.max_tokens is None and self.max_completion_tokens is not None:
            return SamplingParams(self.max_completion_tokens, sp.temperature, sp.top_p,
                                  sp.seed, sp.stop, sp.ignore_eos)
        return sp


def validation_message(exc: ValidationError) -> tuple[str, str]:
    """``(message, param)`` for the first error of a request model."""
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err["loc"])
    return f"{param}: {err['msg']}", param


def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish: str | None, use: dict[str, int],
                    chat: bool) -> dict[str, Any]:
    created = int(time.time())
    if chat:
        return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                             "message": {"role": "assistant", "content": text}}],
                "usage": use}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish,
                         "logprobs": None}], "usage": use}


def chunk_body(rid: str, model: str, text: str | None, finish: str | None, chat: bool,
               first: bool = False, use: dict[str, int] | None = None,
               empty_choices: bool = False) -> dict[str, Any]:
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
                            "logprobs": None}]
    else:
        body["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish,
                            "logprobs": None}]
    if use is not None:
        body["usage"] = use
    return body
