"""What can go wrong when talking to a remote engine, as distinct exceptions.

Every exception carries the ``url`` it concerns. The hierarchy lets a caller decide
per class: retry elsewhere (:class:`EngineUnreachable`, a 5xx :class:`EngineHTTPError`),
give up on the request (:class:`EngineStreamError`, a 4xx), or treat the rank as lost
(:class:`StreamBroken`, :class:`StreamStalled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An engine's error body, whatever its shape (vLLM nests it, SGLang does not)."""

    message: str
    type: str | None = None
    code: int | str | None = None
    param: str | None = None


def parse_error_body(obj: Any) -> ErrorInfo | None:
    """``ErrorInfo`` from a decoded error body, or ``None`` if it is not one.

    Shapes: vLLM ``{"error": {"message", "type", "param", "code"}}``; SGLang
    ``{"object": "error", "message", "type", "param", "code"}`` (and, inside a stream,
    that object under ``"error"``); vLLM's auth ``{"error": "Unauthorized"}``; FastAPI's
    ``{"detail": ...}``.
    """
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, str):
        return ErrorInfo(err)
    if isinstance(err, dict):
        obj = err
    elif "detail" in obj and "message" not in obj:
        return ErrorInfo(str(obj["detail"]))
    msg = obj.get("message")
    if not isinstance(msg, str):
        return None
    type_, code, param = obj.get("type"), obj.get("code"), obj.get("param")
    return ErrorInfo(msg, str(type_) if type_ is not None else None,
                     code if isinstance(code, int | str) else None,
                     str(param) if param is not None else None)


class RemoteEngineError(Exception):
    """Base class; ``url`` is the endpoint that failed."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class EngineUnreachable(RemoteEngineError):
    """No connection could be made (refused, unresolvable, connect timeout)."""


class EngineTimeout(RemoteEngineError):
    """The engine accepted the connection but did not answer in time."""


class EngineDisconnected(RemoteEngineError):
    """The engine closed the connection before a whole non-streamed answer arrived."""


class EngineProtocolError(RemoteEngineError):
    """The answer is not what the protocol says (bad JSON, missing fields)."""


class EngineHTTPError(RemoteEngineError):
    """A non-200 answer; ``error`` is the parsed body when it had the engine's shape."""

    def __init__(self, url: str, status: int, error: ErrorInfo | None, body: str) -> None:
        detail = error.message if error is not None else body[:200]
        super().__init__(url, f"HTTP {status}: {detail}")
        self.status = status
        self.error = error
        self.body = body

    @property
    def retryable(self) -> bool:
        """A server-side failure (5xx): the same request may succeed elsewhere."""
        return self.status >= 500


class EngineStreamError(RemoteEngineError):
    """The stream carried an error event (the engine failed the request mid-stream)."""

    def __init__(self, url: str, error: ErrorInfo) -> None:
        super().__init__(url, f"error in stream: {error.message}")
        self.error = error


class StreamStalled(RemoteEngineError):
    """No byte of the stream arrived for ``stall_s`` seconds (a hung engine or rank)."""

    def __init__(self, url: str, stall_s: float, tokens: int) -> None:
        super().__init__(url, f"stream stalled: no data for {stall_s:g} s after {tokens} "
                              "tokens")
        self.stall_s = stall_s
        self.tokens = tokens


class StreamBroken(RemoteEngineError):
    """The stream ended without ``data: [DONE]`` (connection lost, engine died)."""

    def __init__(self, url: str, reason: str, tokens: int) -> None:
        super().__init__(url, f"stream broken after {tokens} tokens: {reason}")
        self.reason = reason
        self.tokens = tokens
