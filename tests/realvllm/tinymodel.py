# mypy: ignore-errors
# (run by the vLLM venv's interpreter against its own transformers; the project venv's
# transformers stubs differ, so mypy checks it against the wrong library)
"""Build a tiny random-weight Llama model with a local word-level tokenizer (no download).

Run with the vLLM venv's interpreter (it has transformers and tokenizers)::

    .venv-vllm/bin/python tests/realvllm/tinymodel.py OUT_DIR

Shape chosen for vLLM's CPU backend on this machine: 2 layers, hidden 128, 2 heads of
dim 64 (the CPU attention refuses head_dim 16), float32 weights (bf16 needs AMX kernels
that crash here), ``POSITIONS`` positions. The tokenizer maps the words ``w0`` .. ``w499`` and a
few plain words to ids (one whitespace word, one token), so a prompt of N words is N
tokens plus the BOS token; a chat template renders ``role: content`` lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

WORDS = 500
#: long enough that a stream the tests leave mid-way is still decoding when the client's
#: disconnect reaches the engine, even when the graph's decode replica stalls for seconds on
#: a loaded host (the tiny model decodes 400 tokens in about a second; RoPE, so positions
#: cost no weights; 2 KiB of KV per token)
POSITIONS = 8192
SPECIAL = ("<unk>", "<s>", "</s>")
PLAIN = ("hello", "world", "user", "assistant", "system", ":", "the", "a", "of", "and")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                 "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIAL, *PLAIN, *(f"w{i}" for i in range(WORDS))))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=POSITIONS,
                         bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                         tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tinymodel.py OUT_DIR")
    build(Path(sys.argv[1]))
    print(sys.argv[1])
