"""The lean decode-stream client: framing split anywhere, errors, against a real server."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.remote.errors import (
    EngineHTTPError,
    EngineStreamError,
    EngineUnreachable,
    StreamBroken,
    StreamStalled,
)
from br_serve.remote.h1stream import _Protocol, open_stream
from br_serve.remote.sse import TokenChunk
from tests.serve.helpers import free_port


def _sse(texts: list[str], done: bool = True) -> bytes:
    out = b""
    for i, t in enumerate(texts):
        chunk = {"choices": [{"index": 0, "text": t, "finish_reason":
                              "length" if i == len(texts) - 1 else None}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": i + 1}}
        out += b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return out + (b"data: [DONE]\n\n" if done else b"")


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for n in sizes:
        if pos >= len(body):
            break
        part = body[pos:pos + n]
        pos += len(part)
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    if pos < len(body):
        out += f"{len(body) - pos:x}\r\n".encode() + body[pos:] + b"\r\n"
    return out + b"0\r\n\r\n"


HEAD_CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def _run(raw: bytes, splits: list[int]) -> tuple[list[str], BaseException | None]:
    loop = asyncio.new_event_loop()
    try:
        ended: asyncio.Future[None] = loop.create_future()
        texts: list[str] = []
        p = _Protocol("http://x/v1/completions",
                      lambda ev: texts.append(ev.text) if isinstance(ev, TokenChunk)
                      else None, ended)
        pos = 0
        for n in [*splits, len(raw)]:
            if pos >= len(raw) or ended.done():
                break
            p.data_received(raw[pos:pos + max(n, 1)])
            pos += max(n, 1)
        if not ended.done():
            p.connection_lost(None)
        return texts, ended.exception()
    finally:
        loop.close()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="ab é\n", min_size=1, max_size=4), min_size=1, max_size=8),
       st.lists(st.integers(1, 40), max_size=30), st.lists(st.integers(1, 30), max_size=30))
def test_chunked_stream_split_anywhere_gives_every_token(texts: list[str],
                                                         sizes: list[int],
                                                         splits: list[int]) -> None:
    raw = HEAD_CHUNKED + _chunked(_sse(texts), sizes)
    got, exc = _run(raw, splits)
    assert exc is None
    assert got == texts


def test_content_length_and_read_to_close_bodies() -> None:
    body = _sse(["x", "y"])
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert _run(raw, [7]) == (["x", "y"], None)
    raw = b"HTTP/1.1 200 OK\r\n\r\n" + body  # no framing: the body ends at close
    assert _run(raw, [5]) == (["x", "y"], None)


def test_missing_done_is_a_broken_stream() -> None:
    raw = HEAD_CHUNKED + _chunked(_sse(["x"], done=False), [100])
    got, exc = _run(raw, [])
    assert got == ["x"] and isinstance(exc, StreamBroken)
    got, exc = _run(HEAD_CHUNKED + b"5\r\ndata:", [])  # cut inside a chunk
    assert got == [] and isinstance(exc, StreamBroken)


def test_error_status_and_error_event() -> None:
    err = json.dumps({"error": {"message": "bad kv", "type": "BadRequestError",
                                "param": None, "code": 400}}).encode()
    raw = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(err) + err
    _, exc = _run(raw, [3])
    assert isinstance(exc, EngineHTTPError) and exc.status == 400
    assert exc.error is not None and exc.error.message == "bad kv"
    ev = b'data: {"error": {"message": "boom", "type": "x", "code": 500}}\n\ndata: [DONE]\n\n'
    _, exc = _run(HEAD_CHUNKED + _chunked(ev, [9]), [])
    assert isinstance(exc, EngineStreamError)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_real_server_connect_refused_and_stall(loop: str) -> None:
    """Also on uvloop, which Ray's workers run: its transports are not
    ``asyncio.Transport`` subclasses."""
    async def main() -> None:
        port = free_port()
        with pytest.raises(EngineUnreachable):
            await open_stream(f"http://127.0.0.1:{port}/v1/completions", {}, {},
                              lambda ev: None, 1.0)

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(100)
            writer.write(HEAD_CHUNKED)
            await asyncio.sleep(5)
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", port)
        async with server:
            s = await open_stream(f"http://127.0.0.1:{port}/v1/completions", {"a": 1},
                                  {"X-Request-Id": "r"}, lambda ev: None, 1.0)
            with pytest.raises(StreamStalled):
                await s.wait(first_byte_s=0.3, stall_s=0.3)

        async def served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            n = int(next(ln for ln in head.split(b"\r\n") if ln.lower().startswith(
                b"content-length")).split(b":")[1])
            await reader.readexactly(n)
            writer.write(HEAD_CHUNKED + _chunked(_sse(["p", "q"]), [11]))
            await writer.drain()
            writer.close()

        port2 = free_port()
        server = await asyncio.start_server(served, "127.0.0.1", port2)
        async with server:
            got: list[str] = []
            s = await open_stream(f"http://127.0.0.1:{port2}/v1/completions", {"a": 1}, {},
                                  lambda ev: got.append(ev.text)
                                  if isinstance(ev, TokenChunk) else None, 1.0)
            await s.wait(5.0, 5.0)
            assert got == ["p", "q"]

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())
