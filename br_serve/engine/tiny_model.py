"""Randomly initialised Llama-style models for tests, dry runs and step-time fits.

No downloads: the config is built here, the weights are random (seeded), and the
tokenizer is the offline byte-level BPE of :mod:`br_serve.engine.tokenizer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from br_serve.engine import device as _device  # noqa: F401  (sets torch env before torch)
from br_serve.engine.tokenizer import build_byte_level_tokenizer


def llama_config(vocab_size: int = 512, hidden_size: int = 64, layers: int = 2,
                 heads: int = 4, kv_heads: int = 2, intermediate_size: int | None = None,
                 max_positions: int = 2048, initializer_range: float = 0.02) -> Any:
    """A ``LlamaConfig``; ids 0/1/2 are pad/bos/eos as in the byte-level tokenizer.

    Tests raise ``initializer_range`` (e.g. 0.3): with the usual 0.02 a random model's
    attention is nearly uniform, so position or mask bugs would barely change tokens.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions, initializer_range=initializer_range,
        pad_token_id=0, bos_token_id=1,
        eos_token_id=2, tie_word_embeddings=False)


def random_llama(config: Any, seed: int = 0, dtype: str = "float32") -> Any:
    """A ``LlamaForCausalLM`` with seeded random weights, in eval mode."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    return model.eval()


def save_tiny_llama(path: str | Path, seed: int = 0, **config_kwargs: Any) -> Path:
    """Write a tiny random Llama and its tokenizer to ``path`` (created); return it.

    ``config_kwargs`` go to :func:`llama_config` (e.g. ``hidden_size=64, layers=2``);
    ``vocab_size`` bounds the tokenizer, whose actual size becomes the model's.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_byte_level_tokenizer(vocab_size=config_kwargs.pop("vocab_size", 512))
    # the model's vocabulary is the tokenizer's, so every generated id decodes to text
    cfg = llama_config(vocab_size=len(tok), **config_kwargs)
    random_llama(cfg, seed=seed).save_pretrained(out)
    tok.save_pretrained(out)
    return out
