"""Sorted, segmented samples of output lengths with O(log n) vectorised queries.

Both the survival and the ExactMatch predictors reduce to the same question: given a
set of observed output lengths ``o`` (one set per *segment*: a prompt-length bucket or
a prefix key) and a request that has decoded ``a`` tokens, what is
``P(o <= a + H | o > a)`` and ``E[o - a | a < o <= a + H]``?

All segments live in one sorted int64 array of packed values ``segment << 32 | o``, so a
batch of requests in different segments is answered by a handful of ``np.searchsorted``
calls, with no per-request Python. Prefix sums give the conditional mean.
Changes are buffered and applied at the next query (a sorted merge, O(n)).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from br_serve.core.types import FloatArray, IntArray

_SHIFT = 32
_VALUE_MAX = (1 << _SHIFT) - 1


@dataclass(frozen=True, slots=True)
class SegmentAnswer:
    """Per-request answer of :meth:`SegmentedSamples.query`.

    ``alive[j]``: samples of the segment with ``o > a`` (the request's peers that were
    still running at its age); ``p_fin`` is 0 and ``mu_rem`` is ``H`` where it is 0.
    ``total`` / ``mean_all``: size and mean of the whole segment (mean 0 when empty).
    """

    p_fin: FloatArray
    mu_rem: FloatArray
    alive: IntArray
    total: IntArray
    mean_all: FloatArray


class SegmentedSamples:
    """A multiset of ``(segment, value)`` pairs, sorted, with buffered updates.

    Invariants: values lie in ``[0, 2**32)``; segments are ``>= 0`` and ``< 2**30``.
    Removing a pair that is not present raises ``KeyError`` (at the next flush).
    """

    __slots__ = ("_add", "_counts", "_csum", "_del", "_packed")

    def __init__(self) -> None:
        self._packed: IntArray = np.zeros(0, dtype=np.int64)
        self._csum: FloatArray = np.zeros(1, dtype=np.float64)
        self._add: list[int] = []
        self._del: list[int] = []
        self._counts: dict[int, int] = {}

    @staticmethod
    def _pack(segment: int, value: int) -> int:
        return (segment << _SHIFT) | min(max(int(value), 0), _VALUE_MAX)

    def add(self, segment: int, value: int) -> None:
        self._add.append(self._pack(segment, value))
        self._counts[segment] = self._counts.get(segment, 0) + 1

    def remove(self, segment: int, value: int) -> None:
        self._del.append(self._pack(segment, value))
        left = self._counts.get(segment, 0) - 1
        if left > 0:
            self._counts[segment] = left
        else:
            self._counts.pop(segment, None)

    def count(self, segment: int) -> int:
        """Samples in ``segment`` (pending changes included)."""
        return self._counts.get(segment, 0)

    def __len__(self) -> int:
        return sum(self._counts.values())

    def _flush(self) -> None:
        if not (self._add or self._del):
            return
        packed = self._packed
        # Adds first (a removal may target a value added in the same batch); both steps
        # are O(n) merges into the sorted array, never a full re-sort.
        if self._add:
            adds = np.sort(np.array(self._add, dtype=np.int64))
            packed = np.insert(packed, np.searchsorted(packed, adds), adds)
            self._add = []
        if self._del:
            dels = np.sort(np.array(self._del, dtype=np.int64))
            self._del = []
            pos = np.searchsorted(packed, dels, side="left")
            if dels.size > 1 and bool((dels[1:] == dels[:-1]).any()):
                # Equal packed values are interchangeable: the k-th removal of a value
                # takes the k-th occurrence (position = first + rank among equals).
                _, first, reps = np.unique(dels, return_index=True, return_counts=True)
                pos = pos + (np.arange(dels.size) - np.repeat(first, reps))
            if bool((pos >= packed.size).any()) or bool((packed[np.minimum(
                    pos, packed.size - 1)] != dels).any()):
                raise KeyError("SegmentedSamples.remove: value not present")
            packed = np.delete(packed, pos)
        self._packed = packed
        csum = np.empty(packed.size + 1, dtype=np.float64)
        csum[0] = 0.0
        np.cumsum(packed & _VALUE_MAX, out=csum[1:])
        self._csum = csum

    def query(self, segment: IntArray, decoded: IntArray, horizon: int) -> SegmentAnswer:
        """Survival answer for requests in ``segment`` that decoded ``decoded`` tokens."""
        self._flush()
        n = len(decoded)
        base = np.asarray(segment, dtype=np.int64) << _SHIFT
        a = np.minimum(np.asarray(decoded, dtype=np.int64), _VALUE_MAX - int(horizon))
        # One searchsorted for all five boundaries (each call has a fixed overhead):
        # first value > a, first > a + H, first of the next segment, first of this one.
        q = np.concatenate([base | a, base | (a + int(horizon)),
                            base + ((1 << _SHIFT) - 1), base - 1])
        idx = np.searchsorted(self._packed, q, side="right")
        lo, hi, end, start = idx[:n], idx[n:2 * n], idx[2 * n:3 * n], idx[3 * n:]
        alive = end - lo
        fin = hi - lo
        csum = self._csum
        p_fin = fin / np.maximum(alive, 1)  # fin <= alive, so 0 where alive == 0
        mu = np.where(fin > 0, (csum[hi] - csum[lo]) / np.maximum(fin, 1) - a,
                      float(horizon))
        total = end - start
        mean_all = (csum[end] - csum[start]) / np.maximum(total, 1)
        return SegmentAnswer(p_fin=p_fin, mu_rem=mu, alive=alive, total=total,
                             mean_all=mean_all)


    def query_fin(self, segment: IntArray, decoded: IntArray, horizon: int
                  ) -> tuple[FloatArray, FloatArray]:
        """``(p_fin, mu_rem)`` of :meth:`query`, and only those (the tick's hot path:
        with one segment for all requests its bounds are two scalar searches)."""
        self._flush()
        seg = np.asarray(segment, dtype=np.int64)
        a = np.minimum(np.asarray(decoded, dtype=np.int64), _VALUE_MAX - int(horizon))
        n = a.shape[0]
        packed = self._packed
        s0 = int(seg[0]) if n else 0
        if n and bool((seg == s0).all()):
            end: IntArray | int = int(np.searchsorted(
                packed, (s0 << _SHIFT) + _VALUE_MAX, side="right"))
            q = np.concatenate([a, a + int(horizon)])
            if s0:
                q |= s0 << _SHIFT
            idx = np.searchsorted(packed, q, side="right")
        else:
            base = seg << _SHIFT
            idx = np.searchsorted(packed, np.concatenate(
                [base | a, base | (a + int(horizon)), base + _VALUE_MAX]), side="right")
            end = idx[2 * n:]
        lo, hi = idx[:n], idx[n:2 * n]
        fin = hi - lo
        csum = self._csum
        p_fin: FloatArray = fin / np.maximum(end - lo, 1)
        mu: FloatArray = np.where(fin > 0, (csum[hi] - csum[lo]) / np.maximum(fin, 1) - a,
                                  float(horizon))
        return p_fin, mu


class SampleMemory:
    """Bounded memory of one segment's samples: a sliding window or a reservoir.

    ``offer(value)`` returns ``(kept, evicted)``: whether ``value`` entered the memory
    and which value (if any) left it, so the caller can mirror the change in a
    :class:`SegmentedSamples`. The reservoir (Algorithm R) draws from the injected RNG.
    """

    __slots__ = ("_buf", "_capacity", "_mode", "_rng", "_seen", "_window")

    def __init__(self, mode: str, capacity: int, rng: np.random.Generator) -> None:
        if mode not in ("window", "reservoir"):
            raise ValueError(f"memory: {mode!r} is not 'window' or 'reservoir'")
        if capacity < 1:
            raise ValueError(f"max_samples: must be >= 1 (got {capacity})")
        self._mode = mode
        self._capacity = capacity
        self._rng = rng
        self._seen = 0
        self._window: deque[int] = deque()
        self._buf: list[int] = []

    def values(self) -> list[int]:
        return list(self._window) if self._mode == "window" else list(self._buf)

    def offer(self, value: int) -> tuple[bool, int | None]:
        self._seen += 1
        if self._mode == "window":
            self._window.append(value)
            if len(self._window) > self._capacity:
                return True, self._window.popleft()
            return True, None
        if len(self._buf) < self._capacity:
            self._buf.append(value)
            return True, None
        j = int(self._rng.integers(0, self._seen))
        if j < self._capacity:
            old = self._buf[j]
            self._buf[j] = value
            return True, old
        return False, None
