"""The torch engine: a real Hugging Face causal LM behind the engine interface.

One :class:`TorchEngine` serves as a prefill engine (prompt -> KV payload + first token)
and as a decode engine (admit prefilled requests, step them all together).

Contracts:
- Model: ``AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True)``;
  nothing is ever downloaded. The tokenizer is the one saved in the same folder, if any
  (without one, prompts must be token-id lists and texts are empty).
- KV payload (what :meth:`prefill` returns in ``PrefillResult.kv`` and :meth:`admit`
  takes): ``{"keys": Tensor, "values": Tensor}``, contiguous CPU tensors of shape
  ``[layers, kv_heads, prompt_tokens, head_dim]`` in the engine dtype. Both transports
  move it as is (Ray: zero-copy tensors; Mooncake: :mod:`br_serve.transport.payload` packing).
- Decode: every admitted request gets exactly one token per :meth:`step`, batched in
  forward passes of at most ``max_batch`` rows (left-padded KV, per-row positions; see
  :mod:`br_serve.engine.batch`). Greedy output equals ``model.generate(do_sample=False)``
  of the same prompt. Sampling uses a per-request generator (see
  :mod:`br_serve.engine.sampling`). A request finishes on EOS (unless ``ignore_eos``), a
  stop string, or ``max_tokens`` (which counts the prefill token).
- ``load_tokens`` = sum over running requests of ``prompt + decode steps run so far``,
  which is exactly the number of KV entries the model attends to next step.

Errors (at construction, never a hang): a missing model folder or config ->
``FileNotFoundError``; an unknown dtype or bad ``max_batch`` -> ``ValueError``; an
absent device -> :class:`~br_serve.engine.device.DeviceError` (a ``ValueError``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from br_serve.engine import device as devmod  # before torch: sets the autoload env
from br_serve.engine.base import (
    Engine,
    EngineCapabilities,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)
from br_serve.engine.sampling import TextStream, choose_tokens, make_generator, request_seed
from br_serve.engine.tokenizer import load_tokenizer

DTYPES = ("float32", "float16", "bfloat16")


@dataclass(slots=True)
class _Running:
    params: SamplingParams
    prompt_tokens: int
    stream: TextStream
    generator: Any
    batch: Any  # the DecodeBatch holding its KV, or None while pending
    pending_kv: tuple[Any, Any] | None


def _eos_ids(model: Any, tokenizer: Any | None) -> frozenset[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


class TorchEngine(Engine):
    """A causal LM on cpu / cuda / npu implementing PrefillEngine and DecodeEngine."""

    #: nothing beyond the base contract: its step never waits, a request fails only
    #: through ``step``
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()

    name = "torch"

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "float32",
                 max_batch: int = 16, seed: int = 0) -> None:
        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(f"model_path: {model_path} does not exist or is not a "
                                    "folder")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model_path: {path / 'config.json'} not found (expected "
                                    "a Hugging Face model folder)")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: {dtype!r} not one of {', '.join(DTYPES)}")
        dev = devmod.resolve_device(device)
        import torch
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=getattr(torch, dtype), local_files_only=True)
        except Exception as exc:
            raise ValueError(f"model_path: cannot load a causal LM from {path}: {exc}") from exc
        self._setup(model.to(dev).eval(), load_tokenizer(path), dev, max_batch, seed)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any | None = None, device: str = "cpu",
                   max_batch: int = 16, seed: int = 0) -> TorchEngine:
        """An engine around an in-memory model (benchmarks with random weights)."""
        dev = devmod.resolve_device(device)
        self = cls.__new__(cls)
        self._setup(model.to(dev).eval(), tokenizer, dev, max_batch, seed)
        return self

    def _setup(self, model: Any, tokenizer: Any | None, dev: Any, max_batch: int,
               seed: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = dev
        self.max_batch = max_batch
        self.seed = seed
        self.dtype = next(model.parameters()).dtype
        self._eos = _eos_ids(model, tokenizer)
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        cfg = model.config.get_text_config(decoder=True)
        self.num_layers = int(cfg.num_hidden_layers)
        self._running: dict[str, _Running] = {}
        self._batches: list[Any] = []

    # -- prefill -------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt (a string needs the tokenizer; ids pass through)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a string prompt needs a tokenizer in the model "
                                 "folder; pass token ids instead")
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        ids = [int(t) for t in prompt]
        vocab = int(self.model.config.vocab_size)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:  # the embedding lookup would fail inside the forward pass
            raise ValueError(f"prompt: token id {bad} is outside the vocabulary "
                             f"(0 .. {vocab - 1})")
        return ids

    def count_tokens(self, prompt: str | list[int]) -> int:
        return len(self.encode(prompt))

    def _check_params(self, params: SamplingParams) -> None:
        if params.max_tokens < 1:
            raise ValueError("max_tokens: must be >= 1")
        if params.temperature < 0:
            raise ValueError("temperature: must be >= 0")
        if not 0 < params.top_p <= 1:
            raise ValueError("top_p: must be in (0, 1]")

    def prefill(self, request_id: str, prompt: str | list[int],
                params: SamplingParams) -> PrefillResult:
        """Run the prompt, return its KV payload (CPU tensors) and the first token."""
        import torch
        from transformers import DynamicCache

        from br_serve.engine.batch import cache_kv

        self._check_params(params)
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("prompt: must contain at least one token")
        stream = TextStream(self.tokenizer, params, self._eos)
        with torch.no_grad():
            cache = DynamicCache(config=self.model.config)
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=1,
                             **{self._cache_kwarg: cache})
            gen = make_generator(self.device, request_seed(self.seed, request_id, params, 0))
            first = choose_tokens(out.logits[:, -1, :], [params], [gen])[0]
            layers = cache_kv(cache)
            keys = torch.stack([k[0] for k, _ in layers]).cpu().contiguous()
            values = torch.stack([v[0] for _, v in layers]).cpu().contiguous()
        text, done, reason = stream.push(first)
        return PrefillResult(request_id=request_id, prompt_tokens=len(ids),
                             first_token_id=first, first_token_text=text,
                             kv={"keys": keys, "values": values}, finished=done,
                             finish_reason=reason)

    # -- decode --------------------------------------------------------------------
    def _check_kv(self, kv: Any, prompt_tokens: int) -> tuple[Any, Any]:
        if not isinstance(kv, dict) or "keys" not in kv or "values" not in kv:
            raise ValueError("kv: expected a dict with 'keys' and 'values' tensors")
        keys, values = kv["keys"], kv["values"]
        want_layers = self.num_layers
        for name, t in (("keys", keys), ("values", values)):
            shape = tuple(getattr(t, "shape", ()))
            if len(shape) != 4 or shape[0] != want_layers or shape[2] != prompt_tokens:
                raise ValueError(f"kv: {name} has shape {shape}, expected [{want_layers}, "
                                 f"kv_heads, {prompt_tokens}, head_dim]")
        if tuple(keys.shape) != tuple(values.shape):
            raise ValueError(f"kv: keys {tuple(keys.shape)} and values "
                             f"{tuple(values.shape)} differ")
        return keys.to(self.device, self.dtype), values.to(self.device, self.dtype)

    def admit(self, request_id: str, kv: Any, prompt_tokens: int, first_token_id: int,
              params: SamplingParams) -> None:
        """Install a prefilled request; it joins the batch at the next :meth:`step`.

        Raises:
            ValueError: duplicate id, bad params, or a KV payload that does not match
                this model and ``prompt_tokens`` (a transport that lost data).
        """
        if request_id in self._running:
            raise ValueError(f"request_id: {request_id!r} already admitted")
        self._check_params(params)
        keys, values = self._check_kv(kv, prompt_tokens)
        stream = TextStream(self.tokenizer, params, self._eos)
        stream.push(first_token_id)  # rebuild the prefill side's text state
        gen = make_generator(self.device, request_seed(self.seed, request_id, params, 1))
        self._running[request_id] = _Running(params, prompt_tokens, stream, gen, None,
                                             (keys, values))

    def _place_pending(self) -> None:
        """Put admitted-but-not-batched requests into batches (fullest-last, one rebuild
        per batch)."""
        from br_serve.engine.batch import DecodeBatch

        pending = [(rid, r) for rid, r in self._running.items() if r.pending_kv is not None]
        while pending:
            batch = min((b for b in self._batches if b.room() > 0), key=len, default=None)
            if batch is None:
                batch = DecodeBatch(self.model, self.device, self.max_batch, self._cache_kwarg)
                self._batches.append(batch)
            take, pending = pending[: batch.room()], pending[batch.room():]
            batch.add([(rid, *r.pending_kv) for rid, r in take if r.pending_kv is not None])
            for _, r in take:
                r.batch, r.pending_kv = batch, None

    def step(self) -> list[TokenEvent]:
        """One token for every admitted request; finished requests leave the engine."""
        import torch

        self._place_pending()
        events: list[TokenEvent] = []
        with torch.no_grad():
            for batch in self._batches:
                runs = [self._running[rid] for rid in batch.rows]
                logits = batch.forward(
                    [r.stream.ids[-1] for r in runs],
                    [r.prompt_tokens + len(r.stream.ids) - 1 for r in runs])
                tokens = choose_tokens(logits, [r.params for r in runs],
                                       [r.generator for r in runs])
                for rid, r, tid in zip(list(batch.rows), runs, tokens, strict=True):
                    text, done, reason = r.stream.push(tid)
                    events.append(TokenEvent(rid, tid, text, len(r.stream.ids) - 1, done,
                                             reason))
        self._drop([ev.request_id for ev in events if ev.finished])
        return events

    def _drop(self, request_ids: list[str]) -> None:
        by_batch: dict[int, tuple[Any, set[str]]] = {}
        for rid in request_ids:
            r = self._running.pop(rid, None)
            if r is not None and r.batch is not None:
                by_batch.setdefault(id(r.batch), (r.batch, set()))[1].add(rid)
        for batch, rids in by_batch.values():
            batch.remove(rids)  # one rebuild per batch, however many rows leave
            if len(batch) == 0:
                self._batches.remove(batch)

    def abort(self, request_id: str) -> None:
        """Drop a request now (pending or batched); unknown ids are ignored."""
        self._drop([request_id])

    def load_tokens(self) -> int:
        return sum(r.prompt_tokens + len(r.stream.ids) - 1 for r in self._running.values())

    def running(self) -> int:
        return len(self._running)

    def running_ids(self) -> list[str]:
        return list(self._running)

    def prompt_tokens_of(self, request_id: str) -> int:
        return self._running[request_id].prompt_tokens

    def decoded_steps(self, request_id: str) -> int:
        """Decode steps run for ``request_id`` (its load is ``prompt + this``)."""
        return len(self._running[request_id].stream.ids) - 1
