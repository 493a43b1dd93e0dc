"""The emulated engine: deterministic tokens, continuation, KV size, step-time model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core.step import StepModel
from br_serve.engine.base import SamplingParams
from br_serve.engine.emulated import EmulatedEngine, token_id, token_text


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


def run_to_end(eng: EmulatedEngine, rid: str, prompt: str, params: SamplingParams) -> list[int]:
    res = eng.prefill(rid, prompt, params)
    toks = [res.first_token_id]
    if res.finished:
        return toks
    eng.admit(rid, res.kv, res.prompt_tokens, res.first_token_id, params)
    while eng.running():
        for ev in eng.step():
            assert ev.request_id == rid
            assert ev.index == len(toks)
            toks.append(ev.token_id)
    return toks


def test_token_count_and_kv_size() -> None:
    eng = EmulatedEngine(kv_bytes_per_token=8, sleep=FakeSleep())
    res = eng.prefill("r", "one two  three\nfour", SamplingParams(max_tokens=3, seed=1))
    assert res.prompt_tokens == 4
    assert res.kv.nbytes == 32
    assert eng.count_tokens([5, 6, 7]) == 3
    with pytest.raises(ValueError, match="prompt"):
        eng.prefill("r", "   ", SamplingParams())


def test_output_length_is_max_tokens_and_tokens_follow_positions() -> None:
    eng = EmulatedEngine(sleep=FakeSleep())
    params = SamplingParams(max_tokens=7, seed=42)
    toks = run_to_end(eng, "a", "x y z", params)
    assert toks == [token_id(42, 3 + i) for i in range(7)]
    assert eng.load_tokens() == 0 and eng.running() == 0


@settings(max_examples=30, deadline=None)
@given(prompt_len=st.integers(1, 30), max_tokens=st.integers(2, 20), cut=st.integers(1, 19),
       seed=st.integers(0, 2**31))
def test_reprefill_continues_the_same_sequence(prompt_len: int, max_tokens: int, cut: int,
                                               seed: int) -> None:
    """Prompt + first k tokens, re-prefilled, yields exactly tokens k.. of the original."""
    cut = min(cut, max_tokens - 1)
    eng = EmulatedEngine(sleep=FakeSleep())
    prompt = " ".join(["w"] * prompt_len)
    full = run_to_end(eng, "a", prompt, SamplingParams(max_tokens=max_tokens, seed=seed))
    ext = prompt + "".join(token_text(t) for t in full[:cut])
    rest = run_to_end(eng, "b", ext, SamplingParams(max_tokens=max_tokens - cut, seed=seed))
    assert full[:cut] + rest == full


def test_admit_rejects_wrong_kv_size_and_duplicates() -> None:
    eng = EmulatedEngine(kv_bytes_per_token=4, sleep=FakeSleep())
    p = SamplingParams(max_tokens=4)
    res = eng.prefill("r", "a b", p)
    with pytest.raises(ValueError, match="kv"):
        eng.admit("r", np.zeros(7, np.uint8), 2, res.first_token_id, p)
    eng.admit("r", res.kv, 2, res.first_token_id, p)
    with pytest.raises(ValueError, match="already"):
        eng.admit("r", res.kv, 2, res.first_token_id, p)


def test_step_sleeps_the_step_model_for_its_own_load() -> None:
    sleep = FakeSleep()
    eng = EmulatedEngine(step=StepModel(1e-3, 0.5), slowdown=2.0, sleep=sleep)
    p = SamplingParams(max_tokens=10)
    for rid, prompt in (("a", "w " * 100), ("b", "w " * 50)):
        res = eng.prefill(rid, prompt, p)
        eng.admit(rid, res.kv, res.prompt_tokens, res.first_token_id, p)
    assert eng.load_tokens() == 150
    eng.step()
    assert sleep.calls[-1] == pytest.approx(2.0 * (1e-3 * 150 + 0.5))
    assert eng.load_tokens() == 152  # each request grew by one KV token
    assert eng.decoded_steps("a") == 1


def test_abort_frees_the_request() -> None:
    eng = EmulatedEngine(sleep=FakeSleep())
    p = SamplingParams(max_tokens=10)
    res = eng.prefill("r", "a b c", p)
    eng.admit("r", res.kv, 3, res.first_token_id, p)
    eng.abort("r")
    assert eng.running() == 0 and eng.step() == []
