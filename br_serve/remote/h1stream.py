"""A lean HTTP/1.1 client for decode streams: an asyncio protocol, events by callback.

Why not httpx: measured on this project's machine, httpx spends about 185-223 µs of
CPU per streamed chunk (httpcore, h11, anyio layers) before any parsing
(``benchmarks/remote_proxy_cost.py --httpx``); one proxy per DP rank handles one
chunk per running request per decode step, which made the proxying cost several ms
per step. This client parses the
response in ``data_received`` (status line, headers, ``Transfer-Encoding: chunked``,
``Content-Length`` or read-to-close bodies) and feeds the body straight into a
:class:`~br_serve.remote.sse.DecodeStreamParser`, calling ``on_event`` for each event.

Contract of :func:`open_stream`: it connects, sends one ``POST`` (``Connection:
close``: one connection per stream, as a streamed request holds it anyway) and returns
an :class:`H1Stream` whose ``ended`` future resolves to ``None`` after ``[DONE]`` or
to the exception that ended the stream, the same exceptions as
:meth:`~br_serve.remote.client.RemoteEngineClient.stream`: :class:`EngineUnreachable`
(connect), :class:`EngineHTTPError` (a status other than 200, body parsed),
:class:`EngineStreamError` (an error event), :class:`StreamBroken` (the connection
dropped, or the body ended without ``[DONE]``), :class:`EngineProtocolError`, and,
from :meth:`H1Stream.wait`, :class:`StreamStalled` (no byte within the first-byte or
stall bound). :meth:`H1Stream.close` ends it early (the engine sees the connection
close and aborts the request).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

from br_serve.remote.errors import (
    EngineHTTPError,
    EngineProtocolError,
    EngineStreamError,
    EngineUnreachable,
    RemoteEngineError,
    StreamBroken,
    StreamStalled,
    parse_error_body,
)
from br_serve.remote.sse import DecodeStreamParser, Done, ErrorEvent, StreamEvent

_MAX_HEAD_BYTES = 64 * 1024


class _Protocol(asyncio.Protocol):
    def __init__(self, url: str, on_event: Callable[[StreamEvent], object],
                 ended: asyncio.Future[None]) -> None:
        self.url = url
        self.on_event = on_event
        self.ended = ended
        self.parser = DecodeStreamParser(url)
        self.transport: asyncio.Transport | None = None
        self.last_data_s = time.monotonic()
        self.got_data = False
        self._buf = b""
        self._head_done = False
        self._status = 0
        self._chunked = False
        self._left: int | None = None   # Content-Length bytes left, None: read to close
        self._chunk_left = 0            # bytes left in the current chunk
        self._chunk_crlf = False        # a chunk's trailing CRLF is due
        self._error_body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # no isinstance check: uvloop's transports (Ray's workers run uvloop) are not
        # subclasses of asyncio.Transport
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.last_data_s = time.monotonic()
        self.got_data = True
        try:
            self._feed(data)
        except RemoteEngineError as exc:
            self._end(exc)

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ended.done():
            return
        if self._head_done and self._status != 200 and self._left is None \
                and not self._chunked:
            self._end(self._http_error())  # an error body read to close
            return
        try:
            self.parser.finish()  # raises StreamBroken without [DONE]
        except RemoteEngineError as err:
            why = f" ({type(exc).__name__}: {exc})" if exc else ""
            if isinstance(err, StreamBroken) and why:
                err = StreamBroken(self.url, f"connection lost{why}",
                                   self.parser.completion_tokens)
            self._end(err)
            return
        self._end(None)

    # -- parsing --------------------------------------------------------------------
    def _end(self, exc: BaseException | None) -> None:
        if not self.ended.done():
            if exc is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _feed(self, data: bytes) -> None:
        if not self._head_done:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD_BYTES:
                    raise EngineProtocolError(self.url, "response head too long")
                return
            head, data = self._buf[:end].decode("latin-1"), self._buf[end + 4:]
            self._buf = b""
            self._head(head)
        if data:
            self._body(data)

    def _head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise EngineProtocolError(self.url, f"bad status line {lines[0][:80]!r}")
        self._status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "transfer-encoding" and "chunked" in value.lower():
                self._chunked = True
            elif name == "content-length" and value.isdigit():
                self._left = int(value)
        if self._chunked:
            self._left = None
        self._head_done = True
        if self._status != 200 and not self._chunked and self._left == 0:
            raise self._http_error()

    def _body(self, data: bytes) -> None:
        if not self._chunked:
            if self._left is not None:
                data = data[:self._left]
                self._left -= len(data)
            self._payload(data)
            if self._left == 0:
                self._body_end()
            return
        buf = self._buf + data
        pos = 0
        n = len(buf)
        while pos < n:
            if self._chunk_crlf:
                if n - pos < 2:
                    break
                pos += 2
                self._chunk_crlf = False
            if self._chunk_left == 0:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size_text = buf[pos:eol].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise EngineProtocolError(self.url, f"bad chunk size {size_text!r}"
                                              ) from None
                pos = eol + 2
                if size == 0:
                    self._buf = b""
                    self._body_end()
                    return
                self._chunk_left = size
            take = min(self._chunk_left, n - pos)
            self._payload(buf[pos:pos + take])
            pos += take
            self._chunk_left -= take
            if self._chunk_left == 0:
                self._chunk_crlf = True
        self._buf = buf[pos:]

    def _payload(self, data: bytes) -> None:
        if not data:
            return
        if self._status != 200:
            self._error_body += data
            return
        for ev in self.parser.feed(data):
            if isinstance(ev, ErrorEvent):
                raise EngineStreamError(self.url, ev.error)
            self.on_event(ev)
            if isinstance(ev, Done):
                self._end(None)
                return

    def _body_end(self) -> None:
        if self._status != 200:
            raise self._http_error()
        self.parser.finish()  # raises StreamBroken without [DONE]
        self._end(None)

    def _http_error(self) -> EngineHTTPError:
        text = self._error_body.decode(errors="replace")
        try:
            info = parse_error_body(json.loads(text))
        except ValueError:
            info = None
        return EngineHTTPError(self.url, self._status, info, text)


class H1Stream:
    """One open decode stream (see the module docstring)."""

    def __init__(self, protocol: _Protocol) -> None:
        self._p = protocol
        self.ended = protocol.ended

    @property
    def completion_tokens(self) -> int:
        return self._p.parser.completion_tokens

    async def wait(self, first_byte_s: float, stall_s: float) -> None:
        """Until the stream ends; raises its exception, or :class:`StreamStalled` (and
        closes it) when no byte came for ``first_byte_s`` (before the first token) or
        ``stall_s`` (after it)."""
        p = self._p
        while True:
            bound = stall_s if p.parser.completion_tokens else first_byte_s
            left = p.last_data_s + bound - time.monotonic()
            if left <= 0:
                self.close()
                raise StreamStalled(p.url, bound, p.parser.completion_tokens)
            done, _ = await asyncio.wait({self.ended}, timeout=min(left, 1.0))
            if done:
                self.ended.result()
                return

    def close(self) -> None:
        t = self._p.transport
        if t is not None:
            t.close()
        if not self.ended.done():
            self.ended.set_exception(StreamBroken(self._p.url, "closed by the client",
                                                  self._p.parser.completion_tokens))
            self.ended.exception()  # retrieved: no "never retrieved" warning


async def open_stream(url: str, body: Mapping[str, Any], headers: Mapping[str, str],
                      on_event: Callable[[StreamEvent], object],
                      connect_s: float = 3.0) -> H1Stream:
    """POST ``body`` (JSON) to ``url`` (``http://host:port/path``) and return the open
    stream; ``on_event`` runs on the loop for each parsed event.

    Raises:
        EngineUnreachable: cannot connect within ``connect_s``.
        ValueError: ``url`` is not plain ``http``.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url!r}: the stream client speaks plain http only")
    host, port = parts.hostname, parts.port or 80
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    proto = _Protocol(url, on_event, ended)
    try:
        await asyncio.wait_for(loop.create_connection(lambda: proto, host, port),
                               connect_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise EngineUnreachable(url, f"cannot connect ({type(exc).__name__}: {exc})"
                                ) from None
    payload = json.dumps(body, separators=(",", ":")).encode()
    lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {host}:{port}",
             "Content-Type: application/json", "Accept: text/event-stream",
             f"Content-Length: {len(payload)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    assert proto.transport is not None
    proto.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
    return H1Stream(proto)
