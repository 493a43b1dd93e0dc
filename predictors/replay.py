"""Replay a trace as the stream of prediction moments a router would see.

Evaluation protocol (documented in ``docs/predictors.md``):

- Each request ``i`` (arrival ``t_i``, output ``o_i``) decodes one token every
  ``step_s`` seconds from its arrival: it finishes at ``t_i + o_i * step_s`` (no
  queueing; a replay of lengths, not of a cluster).
- A *sample* is ``(i, a)`` at decoded steps ``a = 0, dT, 2 dT, ... < o_i`` with
  ``dT = max(1, H // 2)``, taken at time ``t_i + a * step_s``. Label: the request
  finishes within the window, ``o_i - a <= H``; the ``mu_rem`` target is ``o_i - a``.
- Samples are visited in time order; before each one, every request that finished at
  or before that time has been passed to ``observe``. Nothing later is visible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from br_serve.core.predictor import FinishedRequests
from br_serve.core.types import BoolArray, FloatArray, IntArray, RunningRequests


class TraceLike(Protocol):
    """What the replay needs of a trace (``br_serve.traces.Trace`` satisfies it)."""

    @property
    def arrival_s(self) -> FloatArray: ...
    @property
    def input_tokens(self) -> IntArray: ...
    @property
    def output_tokens(self) -> IntArray: ...
    @property
    def hash_ids(self) -> tuple[tuple[int, ...], ...] | None: ...


class Observer(Protocol):
    def observe(self, finished: FinishedRequests) -> None: ...


@dataclass(frozen=True, slots=True)
class Samples:
    """Prediction moments, sorted by ``time_s``; ``remaining = o - decoded >= 1``."""

    request: IntArray
    decoded: IntArray
    remaining: IntArray
    time_s: FloatArray

    def __len__(self) -> int:
        return int(self.request.shape[0])

    def labels(self, horizon: int) -> BoolArray:
        out: BoolArray = self.remaining <= horizon
        return out

    def subset(self, mask: BoolArray) -> Samples:
        return Samples(self.request[mask], self.decoded[mask], self.remaining[mask],
                       self.time_s[mask])


def check_trace(trace: TraceLike, source: str = "trace") -> None:
    """Raise ``ValueError`` naming the problem if ``trace`` cannot be replayed."""
    for field in ("arrival_s", "input_tokens", "output_tokens"):
        if getattr(trace, field, None) is None:
            raise ValueError(f"{source}: has no {field!r} field; the predictors need "
                             "arrival times, prompt and output lengths")
    n = len(trace.arrival_s)
    if n == 0:
        raise ValueError(f"{source}: no requests")
    if len(trace.input_tokens) != n or len(trace.output_tokens) != n:
        raise ValueError(f"{source}: field lengths differ")
    if (np.asarray(trace.output_tokens) < 1).any():
        raise ValueError(f"{source}: output_tokens must be >= 1 for every request")
    if (np.diff(np.asarray(trace.arrival_s)) < 0).any():
        raise ValueError(f"{source}: arrival_s must be ascending")


def sample_grid(trace: TraceLike, horizon: int, step_s: float) -> Samples:
    """All prediction moments of the protocol above, in time order."""
    if step_s <= 0:
        raise ValueError(f"step_s: must be > 0 (got {step_s})")
    every = max(1, horizon // 2)
    out = np.asarray(trace.output_tokens, dtype=np.int64)
    per = (out - 1) // every + 1  # a = 0, every, ... < o
    req = np.repeat(np.arange(out.size, dtype=np.int64), per)
    first = np.repeat(np.cumsum(per) - per, per)
    dec = (np.arange(req.size, dtype=np.int64) - first) * every
    t = np.asarray(trace.arrival_s, dtype=np.float64)[req] + dec * step_s
    order = np.argsort(t, kind="stable")
    return Samples(req[order], dec[order], (out[req] - dec)[order], t[order])


def replay(trace: TraceLike, samples: Samples, step_s: float,
           observers: Sequence[Observer],
           probe: Callable[[RunningRequests, IntArray], None]) -> None:
    """Walk ``samples`` in time order, feeding finishes to ``observers`` first.

    ``probe(running, rows)`` is called once per group of samples that see the same
    history; ``rows`` are the indices into ``samples`` of the batch's rows.
    """
    arr = np.asarray(trace.arrival_s, dtype=np.float64)
    inp = np.asarray(trace.input_tokens, dtype=np.int64)
    out = np.asarray(trace.output_tokens, dtype=np.int64)
    hid = trace.hash_ids
    fin_t = arr + out * step_s
    fin_order = np.argsort(fin_t, kind="stable")
    fin_sorted = fin_t[fin_order]
    # Finishes visible to each sample; samples are time-sorted, so this is monotone.
    seen = np.searchsorted(fin_sorted, samples.time_s, side="right")
    cuts = np.flatnonzero(np.diff(seen)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(samples)]])
    done = 0
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        upto = int(seen[lo])
        if upto > done:
            idx = fin_order[done:upto]
            fin = FinishedRequests(
                prompt_tokens=inp[idx], output_tokens=out[idx],
                prefix_hash=np.full(idx.size, -1, np.int64), finish_s=fin_t[idx],
                hash_ids=None if hid is None else tuple(hid[i] for i in idx.tolist()))
            for ob in observers:
                ob.observe(fin)
            done = upto
        rows = np.arange(lo, hi, dtype=np.int64)
        req = samples.request[lo:hi]
        running = RunningRequests.build(
            np.zeros(hi - lo, np.int64), inp[req], samples.decoded[lo:hi],
            arrival_s=arr[req], request_ids=tuple(str(i) for i in req.tolist()),
            hash_ids=None if hid is None else tuple(hid[i] for i in req.tolist()),
            true_remaining_steps=samples.remaining[lo:hi])
        probe(running, rows)
