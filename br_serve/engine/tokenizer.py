"""Offline tokenizers for the torch engine: load one saved with a model, or build one.

Contracts:
- :func:`load_tokenizer` reads only local files (``local_files_only=True``): it never
  touches the network. A model folder without tokenizer files yields ``None`` (the
  engine then accepts token-id prompts only).
- :func:`build_byte_level_tokenizer` trains a byte-level BPE tokenizer on a given corpus,
  in memory and offline. Byte-level means every string round-trips (any Unicode text
  encodes; ``decode(encode(s)) == s``), whatever the corpus.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")

DEFAULT_CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "balance route sends each prefilled request to a decode replica",
    "data parallel decoding waits at a barrier for the slowest replica every step",
    "hello world, 0123456789 + - * / = ( ) [ ] { } ! ? . , ; :",
)


def has_tokenizer_files(model_path: str | Path) -> bool:
    p = Path(model_path)
    return any((p / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(model_path: str | Path) -> Any | None:
    """The tokenizer saved in ``model_path``, or ``None`` when the folder has none.

    Raises:
        ValueError: tokenizer files exist but cannot be loaded (names the folder).
    """
    if not has_tokenizer_files(model_path):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    except Exception as exc:
        raise ValueError(f"model_path: tokenizer in {model_path} cannot be loaded: {exc}") from exc


def build_byte_level_tokenizer(vocab_size: int = 512,
                               corpus: Iterable[str] = DEFAULT_CORPUS) -> Any:
    """A ``PreTrainedTokenizerFast`` with a byte-level BPE of at most ``vocab_size`` ids.

    Special tokens: ``<pad>`` = 0, ``<s>`` = 1 (bos), ``</s>`` = 2 (eos). The vocabulary
    holds the 256 byte symbols plus as many merges as the corpus supports.

    Raises:
        ValueError: ``vocab_size`` below 259 (256 bytes + 3 specials).
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size: {vocab_size} < 259 (bytes + special tokens)")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer)
    fast: Any = PreTrainedTokenizerFast  # untyped in transformers 5
    return fast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
