"""Left-padded batched KV for the torch engine's decode step.

A :class:`DecodeBatch` holds up to ``max_rows`` requests of different lengths in one
``transformers`` ``DynamicCache``: every layer's keys/values are ``[B, H, T, D]`` with
each row's tokens right-aligned (left padding), and a ``[B, T]`` attention mask marks
the real tokens. Each decode step feeds one token per row with its true position id
(``prompt_tokens + generated - 1``), so RoPE and attention see exactly what a
single-request run sees; padded slots are masked out.

Invariants: ``mask.sum(1)[r] == lengths[r]`` for every row; ``T == max(lengths)`` after
every membership change (leading all-padding columns are trimmed). Membership changes
rebuild the cache (one copy of this batch's KV); a plain step only appends a column.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def cache_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(keys, values)`` of a filled ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


class DecodeBatch:
    """Rows of KV decoded together in one forward pass. Not thread-safe."""

    def __init__(self, model: Any, device: torch.device, max_rows: int,
                 cache_kwarg: str = "cache") -> None:
        self._model = model
        self._cache_kwarg = cache_kwarg  # "past_key_values" before transformers 5
        self._device = device
        self.max_rows = max_rows
        self.rows: list[str] = []
        self.lengths: list[int] = []
        self._cache: Any = None  # a DynamicCache
        self._mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def room(self) -> int:
        return self.max_rows - len(self.rows)

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [] if self._cache is None else cache_kv(self._cache)

    def _rebuild(self, layers: list[tuple[torch.Tensor, torch.Tensor]],
                 mask: torch.Tensor) -> None:
        self._mask = mask
        self._cache = DynamicCache(ddp_cache_data=layers, config=self._model.config)

    def add(self, rows: list[tuple[str, torch.Tensor, torch.Tensor]]) -> None:
        """Append rows ``(request_id, keys, values)``, KV stacked ``[layers, H, L, D]``.

        All rows join in one rebuild (one copy of the batch's KV, however many join).

        Raises:
            RuntimeError: more rows than :meth:`room`.
        """
        if len(rows) > self.room():
            raise RuntimeError(f"decode batch full ({self.max_rows} rows)")
        if not rows:
            return
        kvs = [(k.to(self._device), v.to(self._device)) for _, k, v in rows]
        lengths = [int(k.shape[2]) for k, _ in kvs]
        old = self._layers()
        t_old = int(self._mask.shape[1]) if self._mask is not None else 0
        t = max(t_old, *lengths)

        def left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
            if width == x.shape[2]:
                return x
            pad = x.new_zeros(*x.shape[:2], width - x.shape[2], x.shape[3])
            return torch.cat([pad, x], dim=2)

        layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i in range(int(kvs[0][0].shape[0])):
            ks = [left_pad(k[i].unsqueeze(0), t) for k, _ in kvs]
            vs = [left_pad(v[i].unsqueeze(0), t) for _, v in kvs]
            if old:
                ks.insert(0, left_pad(old[i][0], t))
                vs.insert(0, left_pad(old[i][1], t))
            layers.append((torch.cat(ks, dim=0), torch.cat(vs, dim=0)))
        new_mask = torch.zeros(len(rows), t, dtype=torch.long, device=self._device)
        for r, n in enumerate(lengths):
            new_mask[r, t - n:] = 1
        if self._mask is not None:
            old_mask = torch.cat([torch.zeros(len(self.rows), t - t_old, dtype=torch.long,
                                              device=self._device), self._mask], dim=1)
            new_mask = torch.cat([old_mask, new_mask], dim=0)
        self._rebuild(layers, new_mask)
        self.rows.extend(rid for rid, _, _ in rows)
        self.lengths.extend(lengths)

    def remove(self, request_ids: set[str]) -> None:
        """Drop the given rows (unknown ids are ignored) and trim all-padding columns."""
        keep = [i for i, rid in enumerate(self.rows) if rid not in request_ids]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self.lengths = [self.lengths[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        assert self._mask is not None
        idx = torch.tensor(keep, device=self._device)
        start = int(self._mask.shape[1]) - max(self.lengths)
        layers = [(k[idx, :, start:, :], v[idx, :, start:, :]) for k, v in self._layers()]
        self._rebuild(layers, self._mask[idx, start:])

    def forward(self, input_ids: list[int], position_ids: list[int]) -> torch.Tensor:
        """Run one decode step: feed one token per row; return last logits ``[B, V]``."""
        assert self._cache is not None and self._mask is not None
        b = len(self.rows)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self._device).view(b, 1)
        pos = torch.tensor(position_ids, dtype=torch.long, device=self._device).view(b, 1)
        self._mask = torch.cat(
            [self._mask, torch.ones(b, 1, dtype=torch.long, device=self._device)], dim=1)
        out = self._model(input_ids=ids, attention_mask=self._mask, position_ids=pos,
                          use_cache=True, logits_to_keep=1,
                          **{self._cache_kwarg: self._cache})
        self.lengths = [n + 1 for n in self.lengths]
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def kv_tokens(self) -> int:
        """Real (unpadded) tokens held in this batch's cache."""
        return sum(self.lengths)
