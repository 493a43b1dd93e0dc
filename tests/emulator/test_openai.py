"""Request parsing and chunk formatting of the emulator (no HTTP)."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.emulator.openai import ApiError, ChunkWriter, ParsedRequest, parse_request


def parse(body: dict[str, Any], chat: bool = False, strict: bool = True) -> ParsedRequest:
    return parse_request(body, chat, frozenset({"kv_transfer_params"}), strict, "m", True)


def test_prompt_forms_seed_and_defaults() -> None:
    r = parse({"prompt": "a  b\nc"})
    assert (r.prompt_tokens, r.max_tokens, r.seed) == (3, 16, zlib.crc32(b"a  b\nc"))
    assert parse({"prompt": ["x y"], "seed": 5}).seed == 5
    assert parse({"prompt": [1, 2, 3, 4]}).prompt_tokens == 4
    c = parse({"messages": [{"role": "user", "content": "hi there"}],
               "max_completion_tokens": 4}, chat=True)
    assert c.max_tokens == 4 and c.prompt_tokens == 4  # "user: hi there" + "assistant:"
    s = parse({"prompt": "a", "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert s.include_usage and s.continuous_usage
    assert parse({"prompt": "a", "bogus": 1}, strict=False).prompt_tokens == 1


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"prompt": "a", "bogus": 1}, "bogus", 400),
    ({"prompt": "a", "model": "other"}, "model", 404),
    ({"prompt": "   "}, "prompt", 400),
    ({"prompt": [1, -2]}, "prompt", 400),
    ({"prompt": "a", "max_tokens": True}, "max_tokens", 400),
    ({"prompt": "a", "seed": "7"}, "seed", 400),
    ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options", 400),
    ({"prompt": "a", "stream": True, "stream_options": {"x": 1}}, "stream_options.x", 400),
    ({"prompt": "a", "logprobs": 2}, "logprobs", 400),
    ({"prompt": "a", "stop": ["\n"]}, "stop", 400),
    ({"prompt": "a", "max_tokens": 2, "min_tokens": 3}, "min_tokens", 400),
])
def test_refusals_name_the_field(body: dict[str, Any], param: str, status: int) -> None:
    with pytest.raises(ApiError) as e:
        parse(body)
    assert e.value.param == param and e.value.status == status


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=8), emitted=st.integers(0, 10**6), finished=st.booleans(),
       chat=st.booleans(), cont=st.booleans(), rid=st.text(min_size=1, max_size=8))
def test_token_chunk_bytes_are_the_json_of_the_chunk(text: str, emitted: int, finished: bool,
                                                     chat: bool, cont: bool,
                                                     rid: str) -> None:
    req = ParsedRequest(chat, 5, 9, 1, True, cont, cont, 'm"x')
    w = ChunkWriter(rid, req, {"stop_reason": None})
    raw = w.token(text, emitted, finished)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    content = {"delta": {"content": text}} if chat else {"text": text}
    assert json.loads(raw[6:]) == {
        "id": rid, "object": w.obj, "created": w.created, "model": 'm"x',
        "choices": [{"index": 0, **content, "logprobs": None,
                     "finish_reason": "length" if finished else None,
                     "stop_reason": None}],
        "usage": ({"prompt_tokens": 5, "completion_tokens": emitted,
                   "total_tokens": 5 + emitted} if cont else None)}
