"""Fixtures of the engine tests: a tiny random Llama on disk and a real Mooncake master."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from br_serve.engine import device as _device  # noqa: F401  (torch env before torch)

HAS_MOONCAKE = importlib.util.find_spec("mooncake") is not None
needs_mooncake = pytest.mark.skipif(
    not HAS_MOONCAKE, reason="mooncake-transfer-engine-non-cuda not installed")

PROMPTS = (
    "the quick brown fox",
    "hello world, this is a much longer prompt with many more tokens in it",
    "a",
    "data parallel decoding waits at a barrier",
    "balance",
)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a small shared machine OpenMP spinning makes tiny matmuls
    ~50x slower under load. Restored afterwards (the setting is process-wide)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, hidden-64 random Llama with its byte-level tokenizer (no downloads).

    Large init range: attention is far from uniform, so a wrong position id or mask
    changes the greedy tokens (with 0.02 it would not)."""
    from br_serve.engine.tiny_model import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0, vocab_size=512,
                           hidden_size=64, layers=2, heads=4, kv_heads=2,
                           initializer_range=0.3)  # peaky attention: bugs show


def generate_greedy(model_path: Path, prompts: tuple[str, ...], max_new: int) -> list[list[int]]:
    """Reference: ``model.generate(do_sample=False)`` per prompt, no EOS stop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_path), local_files_only=True)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt")["input_ids"]
            g = model.generate(ids, max_new_tokens=max_new, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
            out.append(g[0, ids.shape[1]:].tolist())
    return out


@pytest.fixture(scope="module")
def mooncake_master() -> Iterator[str]:
    """A real ``mooncake_master`` on free ports for this module; yields ``host:port``."""
    if not HAS_MOONCAKE:
        pytest.skip("mooncake-transfer-engine-non-cuda not installed")
    from br_serve.transport.mooncake_master import MooncakeMaster

    with MooncakeMaster(ready_timeout_s=30) as master:
        yield master.address
