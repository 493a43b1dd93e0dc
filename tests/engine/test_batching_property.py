"""Property: any admission schedule, any max_batch, any lengths -> generate's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from br_serve.engine.base import SamplingParams
from br_serve.engine.torch_engine import TorchEngine

from .conftest import PROMPTS, generate_greedy

N_MAX = 8


@pytest.fixture(scope="module")
def setup(tiny_model: Path) -> tuple[TorchEngine, list[list[int]]]:
    return TorchEngine(str(tiny_model)), generate_greedy(tiny_model, PROMPTS, N_MAX)


schedules = st.lists(st.tuples(st.integers(0, len(PROMPTS) - 1), st.integers(0, 5),
                               st.integers(1, N_MAX)), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules, max_batch=st.integers(1, 4))
def test_any_schedule_matches_generate(setup: tuple[TorchEngine, list[list[int]]],
                                       tiny_model: Path, schedule: list[tuple[int, int, int]],
                                       max_batch: int) -> None:
    prefill, reference = setup
    engine = TorchEngine.from_model(prefill.model, prefill.tokenizer, max_batch=max_batch)
    out: dict[str, list[int]] = {}
    want: dict[str, list[int]] = {}
    prompt_len: dict[str, int] = {}
    step = 0
    last_admit = max(at for _, at, _ in schedule)
    while step <= last_admit or engine.running():
        for j, (i, at, n) in enumerate(schedule):
            if at != step:
                continue
            rid, p = f"q{j}", SamplingParams(max_tokens=n, ignore_eos=True)
            r = prefill.prefill(rid, PROMPTS[i], p)
            out[rid], want[rid], prompt_len[rid] = [r.first_token_id], reference[i][:n], \
                r.prompt_tokens
            if not r.finished:
                engine.admit(rid, r.kv, r.prompt_tokens, r.first_token_id, p)
        # the load is prompt + decode steps so far, request by request
        assert engine.load_tokens() == sum(prompt_len[r] + len(out[r]) - 1
                                           for r in engine.running_ids())
        for ev in engine.step():
            out[ev.request_id].append(ev.token_id)
        step += 1
    assert out == want
