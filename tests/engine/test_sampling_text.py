"""TextStream (detokenisation, stop strings) and sampling primitives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from br_serve.engine.base import SamplingParams
from br_serve.engine.sampling import TextStream, choose_tokens, make_generator, sample_one
from br_serve.engine.tokenizer import build_byte_level_tokenizer


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_byte_level_tokenizer(300)


def _stream_all(tok: Any, text: str, params: SamplingParams) -> tuple[str, str | None, int]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    s = TextStream(tok, params, frozenset({2}))
    out, reason, n = "", None, 0
    for i in ids:
        piece, done, reason = s.push(i)
        out += piece
        n += 1
        if done:
            break
    return out, reason, n


def test_unicode_round_trip_streamed(tok: Any) -> None:
    text = "héllo wörld 漢字 ok"
    out, reason, _ = _stream_all(tok, text, SamplingParams(max_tokens=10_000))
    assert (out, reason) == (text, None)  # nothing held back at a clean character end
    # with a length limit that ends on the last token, everything is flushed
    n_ids = len(tok(text, add_special_tokens=False)["input_ids"])
    out, reason, _ = _stream_all(tok, text, SamplingParams(max_tokens=n_ids))
    assert (out, reason) == (text, "length")


def test_stop_string_not_emitted(tok: Any) -> None:
    text = "alpha beta STOP gamma"
    out, reason, _ = _stream_all(tok, text, SamplingParams(max_tokens=10_000, stop=("STOP",)))
    assert (out, reason) == ("alpha beta ", "stop")
    out, reason, _ = _stream_all(tok, text, SamplingParams(max_tokens=10_000,
                                                          stop=("zzz", " gam")))
    assert (out, reason) == ("alpha beta STOP", "stop")


def test_eos_and_ignore_eos(tok: Any) -> None:
    s = TextStream(tok, SamplingParams(max_tokens=5), frozenset({2}))
    assert s.push(2) == ("", True, "stop")
    s = TextStream(tok, SamplingParams(max_tokens=5, ignore_eos=True), frozenset({2}))
    assert s.push(2)[1] is False


def test_no_tokenizer() -> None:
    s = TextStream(None, SamplingParams(max_tokens=2), frozenset({2}))
    assert s.push(7) == ("", False, None)
    assert s.push(8) == ("", True, "length")
    with pytest.raises(ValueError, match="stop"):
        TextStream(None, SamplingParams(stop=("x",)), frozenset())


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = SamplingParams(temperature=1.0, top_p=0.7)
    gen = make_generator(torch.device("cpu"), 0)
    draws = {sample_one(logits, p, gen) for _ in range(300)}
    assert draws == {0, 1}
    gen = make_generator(torch.device("cpu"), 0)
    full = {sample_one(logits, SamplingParams(temperature=1.0), gen) for _ in range(300)}
    assert full == {0, 1, 2, 3}


def test_choose_tokens_mixes_greedy_and_sampled() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    gens = [make_generator(torch.device("cpu"), s) for s in (1, 2)]
    out = choose_tokens(logits, [SamplingParams(), SamplingParams(temperature=1e-4)], gens)
    assert out == [1, 0]
