"""The decode-stream parser: chunk boundaries anywhere, comments, errors, no [DONE]."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.remote.errors import EngineProtocolError, StreamBroken
from br_serve.remote.sse import (
    DecodeStreamParser,
    Done,
    ErrorEvent,
    SSEDecoder,
    StreamEvent,
    TokenChunk,
    Usage,
)


def chunk(text: str, n: int | None, fin: str | None = None, chat: bool = False) -> str:
    choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}} if chat
                              else {"index": 0, "text": text})
    choice["finish_reason"] = fin
    use = None if n is None else {"prompt_tokens": 3, "completion_tokens": n,
                                  "total_tokens": 3 + n}
    return json.dumps({"id": "x", "object": "text_completion", "choices": [choice],
                       "usage": use}, ensure_ascii=False)


def parse_all(data: bytes, cuts: list[int]) -> list[StreamEvent]:
    p = DecodeStreamParser("u")
    events: list[StreamEvent] = []
    last = 0
    for c in sorted(set(cuts)):
        events += p.feed(data[last:c])
        last = c
    events += p.feed(data[last:])
    return events + p.finish()


texts = st.text(alphabet=st.sampled_from(list("ab é中😀 \\\"")), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.tuples(st.sampled_from(["tok", "comment", "blank"]), texts),
                      max_size=12),
       crlf=st.booleans(), continuous=st.booleans(), chat=st.booleans(),
       cuts=st.lists(st.integers(0, 4000), max_size=30), error=st.booleans())
def test_any_split_gives_the_same_events(items: list[tuple[str, str]], crlf: bool,
                                         continuous: bool, chat: bool, cuts: list[int],
                                         error: bool) -> None:
    nl = "\r\n" if crlf else "\n"
    out: list[str] = []
    want_texts: list[str] = []
    n = 0
    for kind, text in items:
        if kind == "tok":
            n += 1
            out.append(f"data: {chunk(text, n if continuous else None, chat=chat)}{nl}{nl}")
            want_texts.append(text)
        elif kind == "comment":
            out.append(f": keep-alive {text}{nl}")
        else:
            out.append(nl)  # a blank line between events dispatches nothing
    if error:
        out.append('data: {"error": {"message": "boom", "type": "InternalServerError", '
                   f'"param": null, "code": 500}}}}{nl}{nl}')
    out.append(f"data: [DONE]{nl}{nl}")
    data = "".join(out).encode()
    whole = parse_all(data, [])
    assert parse_all(data, [c % (len(data) + 1) for c in cuts]) == whole
    toks = [e for e in whole if isinstance(e, TokenChunk)]
    assert [t.text for t in toks] == want_texts
    if continuous:  # usage on every chunk: exact counts even for empty texts
        assert [t.completion_tokens for t in toks] == list(range(1, n + 1))
    else:
        assert [t.new_tokens for t in toks] == [1 if t else 0 for t in want_texts]
    assert isinstance(whole[-1], Done)
    assert any(isinstance(e, ErrorEvent) for e in whole) == error


def test_usage_chunk_multi_token_chunk_and_role_chunk() -> None:
    role = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant",
                                                            "content": ""}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 0,
                                 "total_tokens": 3}})
    final = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5,
                                                 "total_tokens": 8}})
    data = (f"data: {role}\n\ndata: {chunk('a', 2, chat=True)}\n\n"
            f"data: {chunk('bcd', 5, 'length', chat=True)}\n\n"
            f"data: {final}\n\ndata: [DONE]\n\n").encode()
    evs = parse_all(data, [])
    assert [(e.new_tokens, e.completion_tokens) for e in evs
            if isinstance(e, TokenChunk)] == [(0, 0), (2, 2), (3, 5)]
    assert Usage(3, 5, 8) in evs
    done = evs[-1]
    assert isinstance(done, Done) and done.finish_reason == "length"
    assert done.completion_tokens == 5 and done.usage == Usage(3, 5, 8)


def test_stream_without_done_is_broken() -> None:
    p = DecodeStreamParser("http://d")
    assert len(p.feed(f"data: {chunk('a', 1)}\n\ndata: {chunk('b', 2)}".encode())) == 1
    with pytest.raises(StreamBroken, match=r"after 1 tokens.*inside an event"):
        p.finish()
    p = DecodeStreamParser("http://d")
    p.feed(f"data: {chunk('a', 1)}\n\n".encode())
    with pytest.raises(StreamBroken, match=r"without data: \[DONE\]$"):
        p.finish()


def test_malformed_chunks_are_protocol_errors() -> None:
    with pytest.raises(EngineProtocolError, match="not JSON"):
        DecodeStreamParser().feed(b"data: {oops\n\n")
    with pytest.raises(EngineProtocolError, match="choices"):
        DecodeStreamParser().feed(b'data: {"id": 1}\n\n')
    with pytest.raises(EngineProtocolError, match="UTF-8"):
        DecodeStreamParser().feed(b"data: \xff\xfe\n\n")


def test_sse_fields_multiline_data_and_lone_cr() -> None:
    d = SSEDecoder()
    assert d.feed(b"event: x\rid: 7\rdata: one\rdata:two\r\r") == ["one\ntwo"]
    assert d.feed(b"retry: 10\ndata\n\n") == [""]
    assert d.feed(b"data: tail\r") == []
    assert d.feed(b"\n") == []  # the \n of that \r\n, not a blank line
    assert d.close() == ([], True)  # a line ended, but the event never did
    d = SSEDecoder()
    assert d.feed(b"data: z\n\r") == ["z"]
    assert d.feed(b"\ndata: y\r") == []
    assert d.feed(b"\r\n") == ["y"]
    assert d.close() == ([], False)
