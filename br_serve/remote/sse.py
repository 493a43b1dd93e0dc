"""Incremental parsing of an engine's decode stream (Server-Sent Events).

Two layers, both pure and fed with whatever byte chunks the network delivers:

- :class:`SSEDecoder`: bytes -> the ``data`` payloads of complete events. Lines may end
  in ``\\n``, ``\\r\\n`` or ``\\r`` and be split anywhere (inside a UTF-8 character too);
  comment lines (``: keep-alive``) and ``event:``/``id:``/``retry:`` fields are
  skipped; an event's ``data`` lines are joined with ``\\n``; an event is complete at
  its blank line (an unterminated event at the end of the stream is discarded, as the
  SSE specification says).
- :class:`DecodeStreamParser`: payloads -> :data:`StreamEvent` values. A chunk
  ``{"choices": [...]}`` becomes a :class:`TokenChunk`; one with ``"choices": []`` and a
  ``usage`` becomes :class:`Usage`; ``{"error": ...}`` becomes :class:`ErrorEvent`;
  ``[DONE]`` becomes :class:`Done`. :meth:`DecodeStreamParser.finish` at the end of the
  byte stream raises :class:`~br_serve.remote.errors.StreamBroken` if ``[DONE]``
  never came.

Token counting: with ``stream_options.continuous_usage_stats`` every chunk carries the
cumulative ``usage.completion_tokens`` and ``TokenChunk.new_tokens`` is exact even when
an engine packs several tokens into one chunk; without it a chunk with non-empty text
counts as one token (a chat stream's opening role-only chunk counts as none).
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any

from br_serve.remote.errors import (
    EngineProtocolError,
    ErrorInfo,
    StreamBroken,
    parse_error_body,
)


class SSEDecoder:
    """Bytes in, complete event payloads out."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._buf = ""
        self._data: list[str] = []
        self._skip_lf = False  # the last chunk ended in \r: a leading \n belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        text = self._utf8.decode(chunk)
        if self._skip_lf and text:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        if text.endswith("\r"):
            self._skip_lf = True
        self._buf += text
        out: list[str] = []
        if "\r" in self._buf:
            self._buf = self._buf.replace("\r\n", "\n").replace("\r", "\n")
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self._line(line, out)
        return out

    def close(self) -> tuple[list[str], bool]:
        """End of stream: ``([], partial)``: ``partial`` if an event was cut off."""
        partial = bool(self._buf) or bool(self._data)
        self._buf, self._data, self._skip_lf = "", [], False
        return [], partial

    def _line(self, line: str, out: list[str]) -> None:
        if not line:
            if self._data:
                out.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Text of one chunk; ``completion_tokens``: cumulative count after this chunk."""

    text: str
    new_tokens: int
    completion_tokens: int
    finish_reason: str | None
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Done:
    """``data: [DONE]``; ``usage``: the last usage seen, ``finish_reason`` likewise."""

    usage: Usage | None
    finish_reason: str | None
    completion_tokens: int


StreamEvent = TokenChunk | Usage | ErrorEvent | Done


def _usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    try:
        p = int(obj.get("prompt_tokens") or 0)
        c = int(obj.get("completion_tokens") or 0)
        t = int(obj.get("total_tokens") or p + c)
    except (TypeError, ValueError):
        return None
    return Usage(p, c, t)


class DecodeStreamParser:
    """One decode stream's bytes -> events; ``url`` only labels the exceptions."""

    def __init__(self, url: str = "") -> None:
        self.url = url
        self._sse = SSEDecoder()
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.done = False
        self.error: ErrorInfo | None = None

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        try:
            payloads = self._sse.feed(chunk)
        except UnicodeDecodeError as exc:
            raise EngineProtocolError(self.url, f"stream is not UTF-8: {exc}") from None
        return [ev for p in payloads if (ev := self._payload(p)) is not None]

    def finish(self) -> list[StreamEvent]:
        """The byte stream ended: final events, or ``StreamBroken`` without ``[DONE]``."""
        payloads, partial = self._sse.close()
        events = [ev for p in payloads if (ev := self._payload(p)) is not None]
        if not self.done:
            why = "ended without data: [DONE]" + (" (inside an event)" if partial else "")
            raise StreamBroken(self.url, why, self.completion_tokens)
        return events

    def _payload(self, data: str) -> StreamEvent | None:
        if self.done:
            return None  # nothing may follow [DONE]
        if data.strip() == "[DONE]":
            self.done = True
            return Done(self.usage, self.finish_reason, self.completion_tokens)
        try:
            obj = json.loads(data)
        except ValueError:
            raise EngineProtocolError(self.url, f"chunk is not JSON: {data[:120]!r}") from None
        if not isinstance(obj, dict):
            raise EngineProtocolError(self.url, f"chunk is not an object: {data[:120]!r}")
        if "error" in obj or obj.get("object") == "error":
            info = parse_error_body(obj) or ErrorInfo(str(obj.get("error")))
            self.error = info
            return ErrorEvent(info)
        use = _usage(obj.get("usage"))
        if use is not None:
            self.usage = use
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise EngineProtocolError(self.url, "chunk has no choices list")
        if not choices:
            return use  # the final usage-only chunk (or an empty keep-alive chunk)
        choice = choices[0]
        if not isinstance(choice, dict):
            raise EngineProtocolError(self.url, "choice is not an object")
        text = choice.get("text")
        if text is None:
            delta = choice.get("delta") or {}
            text = delta.get("content") if isinstance(delta, dict) else None
        text = text if isinstance(text, str) else ""
        fin = choice.get("finish_reason")
        if fin is not None:
            self.finish_reason = str(fin)
        if use is not None:
            new = max(use.completion_tokens - self.completion_tokens, 0)
            self.completion_tokens = max(use.completion_tokens, self.completion_tokens)
        else:
            new = 1 if text else 0
            self.completion_tokens += new
        return TokenChunk(text, new, self.completion_tokens, self.finish_reason, use)
