"""The torch engine on CPU without Ray: batched decode equals model.generate, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from br_serve.engine.base import SamplingParams
from br_serve.engine.device import DeviceError
from br_serve.engine.torch_engine import TorchEngine

from .conftest import PROMPTS, generate_greedy

N_NEW = 10


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> list[list[int]]:
    return generate_greedy(tiny_model, PROMPTS, N_NEW)


def _run(engine: TorchEngine, admit_at: dict[int, list[int]], params: list[SamplingParams],
         prefill: TorchEngine | None = None) -> dict[int, list[int]]:
    """Prefill with ``prefill`` (default: same engine), admit prompt i at step
    ``admit_at``, step until all finish; return generated ids per prompt."""
    src = prefill or engine
    out: dict[int, list[int]] = {}
    step, pending = 0, dict(admit_at)
    while pending or engine.running():
        for i in pending.pop(step, []):
            r = src.prefill(f"r{i}", PROMPTS[i], params[i])
            out[i] = [r.first_token_id]
            engine.admit(f"r{i}", r.kv, r.prompt_tokens, r.first_token_id, params[i])
        for ev in engine.step():
            i = int(ev.request_id[1:])
            assert ev.index == len(out[i])
            out[i].append(ev.token_id)
        step += 1
    return out


def test_batched_greedy_equals_generate(tiny_model: Path, reference: list[list[int]]) -> None:
    engine = TorchEngine(str(tiny_model), max_batch=16)
    greedy = [SamplingParams(max_tokens=N_NEW, ignore_eos=True)] * len(PROMPTS)
    out = _run(engine, {0: list(range(len(PROMPTS)))}, greedy)
    assert [out[i] for i in range(len(PROMPTS))] == reference


def test_staggered_admission_small_batches(tiny_model: Path,
                                           reference: list[list[int]]) -> None:
    # Requests join at different steps and leave at different steps (different
    # max_tokens), across several forward groups of at most 2 rows.
    engine = TorchEngine(str(tiny_model), max_batch=2)
    lens = [N_NEW, 4, N_NEW, 7, 2]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
    out = _run(engine, {0: [0, 1], 1: [2], 3: [3, 4]}, params)
    for i, n in enumerate(lens):
        assert out[i] == reference[i][:n], i
    assert engine.running() == 0 and engine.load_tokens() == 0


def test_prefill_on_one_engine_decode_on_another(tiny_model: Path,
                                                 reference: list[list[int]]) -> None:
    pre, dec = TorchEngine(str(tiny_model)), TorchEngine(str(tiny_model), max_batch=3)
    greedy = [SamplingParams(max_tokens=N_NEW, ignore_eos=True)] * len(PROMPTS)
    out = _run(dec, {0: [0, 1, 2], 2: [3, 4]}, greedy, prefill=pre)
    assert [out[i] for i in range(len(PROMPTS))] == reference


def test_load_tokens_and_finish(tiny_model: Path) -> None:
    engine = TorchEngine(str(tiny_model))
    p = SamplingParams(max_tokens=3, ignore_eos=True)
    r = engine.prefill("a", PROMPTS[1], p)
    assert r.prompt_tokens == engine.count_tokens(PROMPTS[1])
    assert r.kv["keys"].shape == (2, 2, r.prompt_tokens, 16)
    engine.admit("a", r.kv, r.prompt_tokens, r.first_token_id, p)
    assert engine.load_tokens() == r.prompt_tokens
    ev1 = engine.step()
    assert engine.load_tokens() == r.prompt_tokens + 1 and not ev1[0].finished
    assert engine.prompt_tokens_of("a") == r.prompt_tokens
    assert engine.decoded_steps("a") == 1 and engine.running_ids() == ["a"]
    ev2 = engine.step()
    assert ev2[0].finished and ev2[0].finish_reason == "length" and ev2[0].index == 2
    assert engine.running() == 0 and engine.step() == []
    one = engine.prefill("b", PROMPTS[0], SamplingParams(max_tokens=1))
    assert one.finished and one.finish_reason in ("length", "stop")


def test_abort_and_duplicate(tiny_model: Path) -> None:
    engine = TorchEngine(str(tiny_model))
    p = SamplingParams(max_tokens=50, ignore_eos=True)
    for rid in ("x", "y"):
        r = engine.prefill(rid, PROMPTS[0], p)
        engine.admit(rid, r.kv, r.prompt_tokens, r.first_token_id, p)
    with pytest.raises(ValueError, match="already admitted"):
        engine.admit("x", r.kv, r.prompt_tokens, r.first_token_id, p)
    engine.step()
    engine.abort("x")
    engine.abort("nope")
    assert [e.request_id for e in engine.step()] == ["y"]


def test_sampling_is_seeded_and_top_p_tiny_is_greedy(tiny_model: Path,
                                                     reference: list[list[int]]) -> None:
    engine = TorchEngine(str(tiny_model))

    def sample(seed: int, top_p: float = 1.0, temperature: float = 1.5) -> list[int]:
        p = SamplingParams(max_tokens=N_NEW, temperature=temperature, top_p=top_p,
                           seed=seed, ignore_eos=True)
        return _run(engine, {0: [1]}, [p, p])[1]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    assert sample(3, top_p=1e-6) == reference[1]


def test_stop_string_cuts_text(tiny_model: Path) -> None:
    engine = TorchEngine(str(tiny_model))
    free = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    r = engine.prefill("f", PROMPTS[0], free)
    engine.admit("f", r.kv, r.prompt_tokens, r.first_token_id, free)
    text = r.first_token_text + "".join(e.text for _ in range(N_NEW) for e in engine.step())
    assert len(text) >= 4
    stop = text[2:4]
    p = SamplingParams(max_tokens=N_NEW, ignore_eos=True, stop=(stop,))
    r = engine.prefill("s", PROMPTS[0], p)
    texts = [r.first_token_text]
    if not r.finished:
        engine.admit("s", r.kv, r.prompt_tokens, r.first_token_id, p)
        while engine.running():
            (ev,) = engine.step()
            texts.append(ev.text)
        assert ev.finish_reason == "stop"
    assert "".join(texts) == text[: text.find(stop)]


def test_bad_inputs_fail_at_start(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TorchEngine(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        TorchEngine(str(tmp_path))
    with pytest.raises(ValueError, match="dtype"):
        TorchEngine(str(tiny_model), dtype="float8")
    with pytest.raises(ValueError, match="max_batch"):
        TorchEngine(str(tiny_model), max_batch=0)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="'cuda' is not present"):
            TorchEngine(str(tiny_model), device="cuda")
    with pytest.raises(DeviceError, match="npu"):
        TorchEngine(str(tiny_model), device="npu")
    with pytest.raises(DeviceError, match="unknown"):
        TorchEngine(str(tiny_model), device="tpu")


def test_bad_requests(tiny_model: Path) -> None:
    engine = TorchEngine(str(tiny_model))
    p = SamplingParams(max_tokens=4)
    r = engine.prefill("a", [5, 6, 7], p)
    assert r.prompt_tokens == 3
    with pytest.raises(ValueError, match="shape"):
        engine.admit("a", r.kv, 4, r.first_token_id, p)  # wrong prompt length
    cut = {"keys": r.kv["keys"][:1], "values": r.kv["values"][:1]}
    with pytest.raises(ValueError, match="shape"):
        engine.admit("a", cut, 3, r.first_token_id, p)
    with pytest.raises(ValueError, match="'keys' and 'values'"):
        engine.admit("a", b"raw", 3, r.first_token_id, p)
    for bad in (SamplingParams(max_tokens=0), SamplingParams(top_p=0.0),
                SamplingParams(temperature=-1.0)):
        with pytest.raises(ValueError):
            engine.prefill("b", [1, 2], bad)
    with pytest.raises(ValueError, match="at least one token"):
        engine.prefill("c", [], p)
    vocab = engine.model.config.vocab_size
    for oov in (vocab, -1):  # refused by name before the forward pass (was an IndexError)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.count_tokens([1, oov])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.prefill("d", [1, oov], p)
    assert engine.running() == 0


def test_bfloat16_engine_moves_bf16_kv(tiny_model: Path) -> None:
    from br_serve.transport.payload import pack_payload, unpack_payload

    pre = TorchEngine(str(tiny_model), dtype="bfloat16")
    dec = TorchEngine(str(tiny_model), dtype="bfloat16", max_batch=2)
    p = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = {}
    for i in (0, 1, 3):
        r = pre.prefill(f"r{i}", PROMPTS[i], p)
        assert r.kv["keys"].dtype == torch.bfloat16
        kv = unpack_payload(pack_payload(r.kv))  # what the Mooncake transport delivers
        dec.admit(f"r{i}", kv, r.prompt_tokens, r.first_token_id, p)
        outs[f"r{i}"] = [r.first_token_id]
    while dec.running():
        for ev in dec.step():
            outs[ev.request_id].append(ev.token_id)
    assert all(len(v) == 4 for v in outs.values())
    # the same bf16 path alone (batch of one) gives the same tokens: batching is exact
    solo = TorchEngine(str(tiny_model), dtype="bfloat16", max_batch=1)
    r = pre.prefill("again", PROMPTS[1], p)
    solo.admit("again", r.kv, r.prompt_tokens, r.first_token_id, p)
    toks = [r.first_token_id] + [solo.step()[0].token_id for _ in range(3)]
    assert toks == outs["r1"]
