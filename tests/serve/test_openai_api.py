"""The OpenAI request surface without Ray: every field honoured or refused by name, and
the stop-string filter the ingress applies to every stream."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.serve.frontend import openai_api as oa
from br_serve.serve.frontend.stopping import OutputFilter

C = {"model": "m", "prompt": "a b"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _refused(body: dict[str, Any], chat: bool) -> oa.RequestError:
    with pytest.raises(oa.RequestError) as info:
        oa.parse_request(body, chat)
    return info.value


# -- bad input: (endpoint, extra fields, the field the 400 must name) -----------------------
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("c", {"max_tokens": "8"}, "max_tokens"),
    ("c", {"max_tokens": 8.0}, "max_tokens"),
    ("c", {"max_tokens": True}, "max_tokens"),
    ("c", {"max_tokens": 0}, "max_tokens"),
    ("c", {"max_tokens": -3}, "max_tokens"),
    ("c", {"stream": "yes"}, "stream"),
    ("c", {"stream": 1}, "stream"),
    ("c", {"temperature": "hot"}, "temperature"),
    ("c", {"temperature": 2.5}, "temperature"),
    ("c", {"top_p": 0}, "top_p"),
    ("c", {"seed": "7"}, "seed"),
    ("c", {"seed": 2**70}, "seed"),
    ("c", {"n": 2}, "n"),
    ("c", {"n": True}, "n"),
    ("c", {"best_of": 3}, "best_of"),
    ("c", {"logprobs": 0}, "logprobs"),
    ("c", {"logprobs": 5}, "logprobs"),
    ("c", {"echo": "yes"}, "echo"),
    ("c", {"prompt": [1, 2], "echo": True}, "echo"),
    ("c", {"suffix": "x"}, "suffix"),
    ("c", {"logit_bias": {"12": 5}}, "logit_bias"),
    ("c", {"presence_penalty": 0.5}, "presence_penalty"),
    ("c", {"frequency_penalty": 1}, "frequency_penalty"),
    ("c", {"frequency_penalty": False}, "frequency_penalty"),  # False is not 0 here
    ("c", {"repetition_penalty": 1.2}, "repetition_penalty"),
    ("c", {"top_k": 5}, "top_k"),
    ("c", {"min_p": 0.1}, "min_p"),
    ("c", {"min_tokens": 3}, "min_tokens"),
    ("c", {"use_beam_search": True}, "use_beam_search"),
    ("c", {"response_format": {"type": "json_object"}}, "response_format"),
    ("c", {"guided_json": {"type": "object"}}, "guided_json"),
    ("c", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("c", {"stop": 5}, "stop"),
    ("c", {"stop": [""]}, "stop"),
    ("c", {"stop": ["a", 3]}, "stop"),
    ("c", {"stop": ["s"] * 65}, "stop"),
    ("c", {"stop_token_ids": [-1]}, "stop_token_ids.0"),
    ("c", {"stop_token_ids": ["1"]}, "stop_token_ids.0"),
    ("c", {"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ("c", {"ignore_eos": "true"}, "ignore_eos"),
    ("c", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("c", {"stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("c", {"stream": True, "stream_options": {"extra": 1}}, "stream_options.extra"),
    ("c", {"prompt": [-1, 2]}, "prompt"),
    ("c", {"prompt": [1, "a"]}, "prompt"),
    ("c", {"prompt": [1, True]}, "prompt"),
    ("c", {"prompt": ["a", "b"]}, "prompt"),
    ("c", {"prompt": [[1], [2]]}, "prompt"),
    ("c", {"prompt": []}, "prompt"),
    ("c", {"prompt": 5}, "prompt"),
    ("c", {"prompt": None}, "prompt"),
    ("c", {"model": 5}, "model"),
    ("c", {"user": 5}, "user"),
    ("c", {"request_id": ""}, "request_id"),
    ("c", {"cache_salt": ""}, "cache_salt"),
    ("c", {"frobnicate": 1}, "frobnicate"),
    ("c", {"tools": []}, "tools"),  # a chat field: unknown to completions
    ("c", {"max_completion_tokens": 4}, "max_completion_tokens"),
    ("chat", {"messages": []}, "messages"),
    ("chat", {"messages": "hi"}, "messages"),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.content"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]},
     "messages.0.tool_calls"),
    ("chat", {"messages": [{"role": "user", "content": "x", "mood": "ok"}]},
     "messages.0.mood"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("chat", {"tool_choice": "auto"}, "tool_choice"),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"logprobs": 1}, "logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format"),
    ("chat", {"echo": True}, "echo"),
    ("chat", {"max_completion_tokens": "5"}, "max_completion_tokens"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"chat_template": "{{x}}"}, "chat_template"),
    ("chat", {"add_generation_prompt": False}, "add_generation_prompt"),
    ("chat", {"n": 3}, "n"),
    ("chat", {"suffix": "x"}, "suffix"),  # a completions field: unknown to chat
    ("chat", {"prompt": "x"}, "prompt"),
]


@pytest.mark.parametrize(("endpoint", "extra", "param"), BAD)
def test_bad_field_is_refused_by_name(endpoint: str, extra: dict[str, Any],
                                      param: str) -> None:
    chat = endpoint == "chat"
    body = {**(CHAT if chat else C), **extra}
    if extra.get("prompt", 0) is None:
        del body["prompt"]  # "required", named
    err = _refused(body, chat)
    assert err.param == param, err.message
    assert err.message.startswith(f"{param}:"), err.message


@pytest.mark.parametrize("key", sorted(oa.REFUSED))
def test_every_refused_field_names_itself(key: str) -> None:
    """Each field of vLLM's server that is not honoured: a non-neutral value -> 400."""
    ends = oa.REFUSED[key][2].split(",")
    field = "logprobs" if key == "chat_logprobs" else key
    for end in ends:
        chat = end == "chat"
        err = _refused({**(CHAT if chat else C), field: "not-neutral"}, chat)
        assert err.param == field and "not supported here" in err.message
        ok = oa.parse_request({**(CHAT if chat else C), field: None}, chat)  # neutral
        assert ok is not None


def test_body_must_be_an_object() -> None:
    assert _refused([1, 2], False).message.startswith("body:")  # type: ignore[arg-type]


# -- accepted input ------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [
    {"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0},
    {"logit_bias": {}, "n": 1, "best_of": 1, "logprobs": None, "top_k": -1},
    {"response_format": {"type": "text"}, "min_tokens": 0, "priority": 0},
    {"user": "alice", "cache_salt": "s", "request_id": "abc", "seed": 2**63 - 1},
    {"stream": True, "stream_options": {"include_usage": False}},
    {"stop": "x", "stop_token_ids": [3], "include_stop_str_in_output": True},
    {"ignore_eos": True, "skip_special_tokens": True, "add_special_tokens": True},
])
def test_neutral_and_supported_values_are_accepted(extra: dict[str, Any]) -> None:
    oa.parse_request({**C, **extra}, False)


def test_chat_neutral_values_are_accepted() -> None:
    req = oa.parse_request({**CHAT, "tools": [], "tool_choice": "none", "logprobs": False,
                            "top_logprobs": 0, "parallel_tool_calls": True,
                            "include_reasoning": False, "echo": False}, True)
    assert isinstance(req, oa.ChatRequest)


@pytest.mark.parametrize(("prompt", "value"), [
    ("a b", "a b"), ([1, 2], [1, 2]), (["a b"], "a b"), ([[4, 5]], [4, 5])])
def test_prompt_forms(prompt: Any, value: Any) -> None:
    req = oa.parse_request({**C, "prompt": prompt}, False)
    assert isinstance(req, oa.CompletionRequest) and req.prompt_value() == value


def test_model_is_optional_and_defaults_follow_vllm() -> None:
    req = oa.parse_request({"prompt": "x"}, False)
    assert req.model is None
    sp = req.sampling()
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.stop) == (16, 0.0, 1.0, ())
    so = oa.parse_request({**C, "stream": True, "stream_options": {}}, False)
    assert so.stream_usage() == (True, False)  # vLLM: include_usage defaults to true
    so = oa.parse_request({**C, "stream": True, "stream_options": {
        "include_usage": False, "continuous_usage_stats": True}}, False)
    assert so.stream_usage() == (False, True)


def test_chat_max_completion_tokens_wins_and_template() -> None:
    req = oa.parse_request({**CHAT, "max_tokens": 3, "max_completion_tokens": 7}, True)
    assert req.sampling().max_tokens == 7
    req = oa.parse_request({**CHAT, "max_tokens": 3}, True)
    assert req.sampling().max_tokens == 3
    req = oa.parse_request({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "name": "bob", "content": [{"type": "text", "text": "a"},
                                                     {"type": "text", "text": "b"}]}]}, True)
    assert isinstance(req, oa.ChatRequest)
    assert req.prompt_value() == "system: be brief\nuser (bob): a\nb\nassistant:"


def test_echo_prefixes_the_prompt() -> None:
    req = oa.parse_request({**C, "echo": True}, False)
    f = req.output_filter()
    assert f.push(1, " t1", False, None) == ("a b t1", False, None)
    assert f.push(2, " t2", True, "length") == (" t2", True, "length")


# -- the stop filter -------------------------------------------------------------------------
def _run(f: OutputFilter, texts: list[str], ids: list[int] | None = None,
         final: str = "length") -> tuple[str, str | None, int]:
    out, reason, n = "", None, 0
    ids = ids or list(range(100, 100 + len(texts)))
    for i, (tid, t) in enumerate(zip(ids, texts, strict=True)):
        piece, done, reason = f.push(tid, t, i == len(texts) - 1, final if i ==
                                     len(texts) - 1 else None)
        out += piece
        n += 1
        if done:
            break
    return out, reason, n


def test_stop_string_across_token_boundaries() -> None:
    f = OutputFilter(["lo w"])
    pieces = [f.push(0, t, False, None) for t in ["he", "l", "lo", " wo", "rld"][:4]]
    assert [p[0] for p in pieces] == ["he", "", "l", ""]  # "l", "lo" held back in turn
    assert pieces[-1] == ("", True, "stop") and f.stop_reason == "lo w"
    out, reason, n = _run(OutputFilter(["lo w"]), ["he", "l", "lo", " wo", "rld"])
    assert (out, reason, n) == ("hel", "stop", 4)
    out, reason, n = _run(OutputFilter(["lo w"], include_stop_str_in_output=True),
                          ["he", "l", "lo", " wo", "rld"])
    assert (out, reason, n) == ("hello w", "stop", 4)


def test_held_text_is_flushed_at_the_end_and_engine_reasons_pass() -> None:
    assert _run(OutputFilter(["xyz"]), ["a", "bx", "y"]) == ("abxy", "length", 3)
    assert _run(OutputFilter(["xyz"]), ["a", "x"], final="stop") == ("ax", "stop", 2)


def test_earliest_stop_wins_and_stop_token_ids() -> None:
    f = OutputFilter(["c", "ab"])
    assert f.push(0, "xabc", False, None) == ("x", True, "stop") and f.stop_reason == "ab"
    f = OutputFilter(stop_token_ids=[7])
    assert _run(f, ["a", "b", "c"], ids=[1, 7, 2]) == ("a", "stop", 2)
    assert f.stop_reason == 7
    f = OutputFilter(stop_token_ids=[7], include_stop_str_in_output=True)
    assert _run(f, ["a", "b", "c"], ids=[1, 7, 2]) == ("ab", "stop", 2)
    assert not OutputFilter().active and OutputFilter(["x"]).active
    with pytest.raises(ValueError, match="stop"):
        OutputFilter([""])


def _reference(texts: list[str], stops: list[str], include: bool) -> tuple[str, int]:
    """Stop at the first token after which the text so far contains a stop string."""
    for k in range(1, len(texts) + 1):
        text = "".join(texts[:k])
        hits = [(i, len(s), s) for s in stops if (i := text.find(s)) >= 0]
        if hits:
            i, _, s = min(hits)
            return text[: i + len(s) if include else i], k
    return "".join(texts), len(texts)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text("ab ", max_size=3), min_size=1, max_size=12),
       stops=st.lists(st.text("ab ", min_size=1, max_size=3), min_size=1, max_size=3),
       include=st.booleans())
def test_filter_matches_the_reference_whatever_the_chunking(
        texts: list[str], stops: list[str], include: bool) -> None:
    f = OutputFilter(stops, include_stop_str_in_output=include)
    out, _reason, n = _run(f, texts)
    assert (out, n) == _reference(texts, stops, include)
