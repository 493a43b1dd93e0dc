"""ExactMatch predictor: reuse the output lengths observed for the same prompt prefix.

A request whose prefix key (``predictors.keys``) has at least ``min_key_samples``
observations, and whose key still has samples longer than what it has already decoded,
is answered from that key's samples exactly as the survival model answers from the
global ones. Every other request (unseen key, no key, or a request that outlived all of
its key's samples) falls back to the embedded :class:`SurvivalPredictor`.

Shrinkage: with ``prior_weight = w > 0`` a key's answer is blended with the survival
answer as if the survival distribution contributed ``w`` extra samples:
``p = (n_alive * p_key + w * p_surv) / (n_alive + w)`` (and ``mu_rem`` likewise, weighted
by the expected number of finishers), which tempers the 0/1 answers of keys seen once.

Bounded memory: at most ``per_key_samples`` (latest) outputs per key and ``max_keys``
keys; the key observed longest ago is evicted first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from br_serve.core.options import Options, option
from br_serve.core.predictor import FinishedRequests, Prediction
from br_serve.core.types import BoolArray, IntArray, RunningRequests
from predictors.keys import DEFAULT_PREFIX_BLOCKS, prefix_keys
from predictors.store import SegmentAnswer, SegmentedSamples
from predictors.survival import SurvivalOptions, SurvivalPredictor


@dataclass(frozen=True, slots=True)
class ExactOptions(Options):
    """Options of :class:`ExactMatchPredictor` (validated, immutable)."""

    prefix_blocks: int = option(DEFAULT_PREFIX_BLOCKS, doc="leading KV blocks of the "
                                "prompt that make its prefix key (<= 0: all of them)")
    per_key_samples: int = option(16, ge=1, doc="latest outputs kept per key")
    max_keys: int = option(65536, ge=1, doc="keys kept (the one observed longest ago is "
                           "evicted first)")
    min_key_samples: int = option(1, ge=1, doc="a key answers once it has this many "
                                  "samples")
    prior_weight: float = option(2.0, ge=0, doc="survival samples a key's answer is "
                                 "blended with (0: the key's own answer)")
    survival: SurvivalOptions = option(SurvivalOptions(), doc="options of the survival "
                                       "fallback (a mapping of its options)")


class ExactMatchPredictor:
    """Prefix-keyed empirical predictor with a survival fallback (module docstring)."""

    name = "exact"

    def __init__(self, config: ExactOptions | None = None, *,
                 rng: np.random.Generator | None = None) -> None:
        self.config = config or ExactOptions()
        self.fallback = SurvivalPredictor(self.config.survival, rng=rng)
        self._store = SegmentedSamples()
        self._keys: OrderedDict[Hashable, tuple[int, deque[int]]] = OrderedDict()
        # key -> segment, only for keys with at least min_key_samples (the hot lookup)
        self._usable: dict[Hashable, int] = {}
        self._next_segment = 0

    @property
    def num_keys(self) -> int:
        return len(self._keys)

    def keys_of(self, hash_ids: Sequence[tuple[int, ...] | None] | None,
                prefix_hash: IntArray) -> list[Hashable | None]:
        return prefix_keys(hash_ids, prefix_hash, self.config.prefix_blocks)

    def observe(self, finished: FinishedRequests) -> None:
        self.fallback.observe(finished)
        keys = self.keys_of(finished.hash_ids, finished.prefix_hash)
        cap = self.config.per_key_samples
        for key, o in zip(keys, np.asarray(finished.output_tokens).tolist(), strict=True):
            if key is None:
                continue
            entry = self._keys.get(key)
            if entry is None:
                if len(self._keys) >= self.config.max_keys:
                    old_key, (old_seg, old_vals) = self._keys.popitem(last=False)
                    self._usable.pop(old_key, None)
                    for v in old_vals:
                        self._store.remove(old_seg, v)
                entry = (self._next_segment, deque())
                self._next_segment += 1
                self._keys[key] = entry
            else:
                self._keys.move_to_end(key)
            seg, vals = entry
            vals.append(o)
            self._store.add(seg, o)
            if len(vals) > cap:
                self._store.remove(seg, vals.popleft())
            if len(vals) >= self.config.min_key_samples:
                self._usable[key] = seg

    def key_segments(self, hash_ids: Sequence[tuple[int, ...] | None] | None,
                     prefix_hash: IntArray) -> IntArray:
        """Segment of each row's key, -1 where the key is absent or has too few samples.

        Same keys as :func:`predictors.keys.prefix_keys`, computed in one pass (this is
        the only per-request Python in ``predict``).
        """
        get = self._usable.get
        ph = np.asarray(prefix_hash, dtype=np.int64).tolist()
        n = len(ph)
        if hash_ids is None:
            return np.fromiter((get(h, -1) if h >= 0 else -1 for h in ph), np.int64, n)
        b = self.config.prefix_blocks
        if len(hash_ids) != n:
            raise ValueError(f"hash_ids: {len(hash_ids)} rows for {n} requests")
        return np.fromiter(
            (get(tuple(row[:b]) if b > 0 else tuple(row), -1) if row
             else (get(h, -1) if h >= 0 else -1)
             for row, h in zip(hash_ids, ph, strict=True)), np.int64, n)

    def key_answer(self, segs: IntArray, decoded: IntArray,
                   horizon_steps: int) -> tuple[SegmentAnswer, BoolArray]:
        """Per-key answer for rows with segment ``segs`` and the mask it is usable for."""
        known = segs >= 0
        ans = self._store.query(np.maximum(segs, 0), decoded, horizon_steps)
        return ans, known & (ans.alive > 0)

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        base = self.fallback.predict(running, horizon_steps)
        if len(running) == 0 or not self._usable:
            return base
        segs = self.key_segments(running.hash_ids, running.prefix_hash)
        ans, use = self.key_answer(segs, running.decoded_tokens, horizon_steps)
        p_key, mu_key = ans.p_fin, ans.mu_rem
        w = self.config.prior_weight
        if w > 0:
            n = ans.alive.astype(np.float64)
            p_key = (n * ans.p_fin + w * base.p_fin) / (n + w)
            fk, fs = n * ans.p_fin, w * base.p_fin
            mu_mix = (fk * ans.mu_rem + fs * base.mu_rem) / np.maximum(fk + fs, 1e-300)
            mu_key = np.where(fk + fs > 0, mu_mix, float(horizon_steps))
        return Prediction(p_fin=np.where(use, p_key, base.p_fin),
                          mu_rem=np.where(use, mu_key, base.mu_rem))
