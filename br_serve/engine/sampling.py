"""Token choice and streamed text for the torch engine (one request at a time).

Contracts:
- :func:`choose_tokens`: greedy (``temperature == 0``) is ``argmax`` of the logits, as
  ``model.generate(do_sample=False)``; otherwise temperature scaling, then nucleus
  filtering (the smallest set of most likely tokens whose mass reaches ``top_p``; the
  most likely token always stays), then one draw from the request's own
  ``torch.Generator``: same seed, same tokens, whatever else shares the batch.
- :class:`TextStream` turns the ids produced so far into the text increments of the
  token events. It never emits a partial UTF-8 character (a trailing U+FFFD is held
  back) nor a suffix that may be the beginning of a stop string; on a stop string it
  emits the text before it and reports ``"stop"`` (OpenAI semantics: the stop string is
  not part of the output). Its state is a pure function of the ids, so the decode side
  rebuilds the prefill side's state from the first token alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from br_serve.engine.base import SamplingParams


def request_seed(engine_seed: int, request_id: str, params: SamplingParams, stage: int) -> int:
    """The seed of one request's generator; ``stage`` 0 = prefill, 1 = decode.

    ``params.seed`` wins when given; otherwise a stable hash of the engine seed and the
    request id (not Python's salted ``hash``), so reruns reproduce.
    """
    base = params.seed if params.seed is not None else (
        zlib.crc32(request_id.encode()) ^ (engine_seed * 0x9E3779B1))
    return (base * 1_000_003 + stage) & 0x7FFF_FFFF_FFFF_FFFF


def make_generator(device: Any, seed: int) -> Any:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample_one(logits: Any, params: SamplingParams, generator: Any) -> int:
    """Draw one token id from a 1-D logits row (temperature > 0)."""
    import torch

    scaled = logits.float() / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        # keep token k when the mass before it is still below top_p (so the first stays)
        keep = (cum - sorted_p) < params.top_p
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        pick = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=generator)
        return int(order[pick].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())


def choose_tokens(logits: Any, params: Sequence[SamplingParams],
                  generators: Sequence[Any]) -> list[int]:
    """One token per row of ``logits`` ``[B, V]`` under each row's params."""
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int] = []
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        out.append(int(greedy[row]) if p.temperature <= 0 else sample_one(logits[row], p, gen))
    return out


def held_suffix(text: str, stops: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class TextStream:
    """Incremental detokenisation with stop strings for one request.

    ``tokenizer`` may be ``None``: texts are then empty and stop strings are rejected.

    Raises:
        ValueError: stop strings without a tokenizer, or an empty stop string.
    """

    __slots__ = ("_emitted", "_eos_ids", "_params", "_tok", "ids")

    def __init__(self, tokenizer: Any | None, params: SamplingParams,
                 eos_ids: frozenset[int]) -> None:
        if params.stop and tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer in the model folder")
        if any(s == "" for s in params.stop):
            raise ValueError("stop: empty stop string")
        self._tok = tokenizer
        self._params = params
        self._eos_ids = eos_ids
        self._emitted = ""
        self.ids: list[int] = []

    def push(self, token_id: int) -> tuple[str, bool, str | None]:
        """Add a token; return ``(text increment, finished, finish_reason)``."""
        self.ids.append(token_id)
        p = self._params
        eos = token_id in self._eos_ids and not p.ignore_eos
        length = len(self.ids) >= p.max_tokens
        if self._tok is None:
            if eos:
                return "", True, "stop"
            return "", length, "length" if length else None
        full = self._tok.decode(self.ids, skip_special_tokens=True)
        start = len(self._emitted)
        if p.stop:
            hits = [i for i in (full.find(s, max(0, start - len(s))) for s in p.stop) if i >= 0]
            if hits:
                cut = max(min(hits), start)
                text = full[start:cut]
                self._emitted += text
                return text, True, "stop"
        if eos or length:
            text = full[start:]
            self._emitted += text
            return text, True, "stop" if eos else "length"
        end = len(full)
        if full.endswith("\ufffd"):
            end -= 1  # an incomplete UTF-8 sequence: wait for the next byte token
        end -= held_suffix(full[:end], p.stop)
        if end <= start or not full.startswith(self._emitted):
            return "", False, None
        text = full[start:end]
        self._emitted += text
        return text, False, None
