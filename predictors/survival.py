"""Empirical survival predictor (docs/design.md, "Predictors"), updated online, bounded memory.

From the observed output lengths ``o`` (per prompt-length bucket when configured):
``p_fin = P(o <= a + H | o > a)`` and ``mu_rem = E[o - a | a < o <= a + H]``, where
``a`` is the request's decoded steps. A request is "remaining ``o - a`` steps" away from
its end; it finishes inside the window when ``o - a <= H``.

With fewer than ``min_samples`` observations (or when the request has outlived every
sample) the answer is the closed gate: ``p_fin = 0`` ("survives the window").
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from br_serve.core.options import ConfigError, Options, option
from br_serve.core.predictor import FinishedRequests, Prediction
from br_serve.core.types import IntArray, RunningRequests
from predictors.store import SampleMemory, SegmentAnswer, SegmentedSamples


@dataclass(frozen=True, slots=True)
class SurvivalOptions(Options):
    """Options of :class:`SurvivalPredictor` (validated, immutable).

    ``prompt_buckets``: ascending prompt-length edges; bucket ``k`` holds prompts in
    ``[edge[k-1], edge[k])``. A bucket with fewer than ``min_bucket_samples`` samples
    answers from the global distribution. ``auto_buckets`` (with no ``prompt_buckets``):
    every ``auto_bucket_after`` finished requests, the edges are refitted at the
    quantiles of the prompt lengths of the last ``max_samples`` finished requests that
    cut them into that many equal-count buckets (tied quantiles merge), and those
    requests are filed into the new buckets (the first fit's requests are the shortest
    to finish, so it is refitted as the history fills); 0 or 1: one distribution.
    """

    memory: Literal["window", "reservoir"] = option(
        "window", doc="which outputs to keep: the latest (window) or a uniform sample "
        "of all (reservoir)")
    max_samples: int = option(4096, ge=1, doc="outputs kept per distribution")
    min_samples: int = option(16, ge=1, doc="below this many samples: the closed gate "
                              "(p_fin = 0)")
    prompt_buckets: tuple[int, ...] = option((), doc="ascending prompt-length edges of "
                                             "per-bucket distributions")
    min_bucket_samples: int = option(64, ge=1, doc="a bucket with fewer samples answers "
                                     "from the global distribution")
    auto_buckets: int = option(0, ge=0, le=64, doc="refit this many equal-count prompt "
                               "buckets online (0 or 1: one distribution)")
    auto_bucket_after: int = option(512, ge=1, doc="finished requests between two refits "
                                    "of the automatic buckets")

    def check(self) -> None:
        v = self.prompt_buckets
        if any(b <= a for a, b in itertools.pairwise(v)) or any(x <= 0 for x in v):
            raise ConfigError(f"prompt_buckets: must be positive and strictly ascending "
                              f"(got {v!r})")
        if self.auto_buckets > 1 and self.prompt_buckets:
            raise ConfigError("auto_buckets: set it or prompt_buckets, not both")


def quantile_edges(prompts: IntArray, buckets: int) -> tuple[int, ...]:
    """Edges cutting ``prompts`` into ``buckets`` equal-count buckets (positive, strictly
    ascending: tied quantiles merge, so there may be fewer)."""
    qs = np.quantile(np.asarray(prompts, dtype=np.float64),
                     np.arange(1, buckets) / buckets, method="higher")
    return tuple(sorted({int(q) for q in qs if q > 0}))


class SurvivalPredictor:
    """Online empirical survival model; see the module docstring for the contract.

    Segment 0 is the global distribution, segment ``k + 1`` prompt bucket ``k``.
    """

    name = "survival"

    def __init__(self, config: SurvivalOptions | None = None, *,
                 rng: np.random.Generator | None = None) -> None:
        self.config = config or SurvivalOptions()
        c = self.config
        rng = rng if rng is not None else np.random.default_rng(0)
        self._rng = rng
        self._edges = np.asarray(c.prompt_buckets, dtype=np.int64)
        self._store = SegmentedSamples()
        self._mem = [SampleMemory(c.memory, c.max_samples, rng)
                     for _ in range(len(c.prompt_buckets) + 2)]
        # with auto_buckets: the last max_samples (prompt, output) pairs, and how many
        # requests finished since the edges were last fitted
        self._recent: deque[tuple[int, int]] | None = (
            deque(maxlen=c.max_samples) if c.auto_buckets > 1 else None)
        self._since_fit = 0

    @property
    def edges(self) -> tuple[int, ...]:
        """The prompt-bucket edges in use (empty: one distribution for all prompts)."""
        return tuple(self._edges.tolist())

    def _refit(self) -> None:
        """Refit the auto-bucket edges and refile the recent requests by them."""
        assert self._recent is not None
        c = self.config
        pairs = list(self._recent)
        edges = quantile_edges(np.array([p for p, _ in pairs]), c.auto_buckets)
        if edges == self.edges:
            return
        self._edges = np.asarray(edges, dtype=np.int64)
        glob = self._mem[0]
        self._store = SegmentedSamples()
        for v in glob.values():
            self._store.add(0, v)
        self._mem = [glob] + [SampleMemory(c.memory, c.max_samples, self._rng)
                              for _ in range(len(edges) + 1)]
        if not edges:
            return
        segs = (np.searchsorted(self._edges, [p for p, _ in pairs], side="right")
                + 1).tolist()
        for (_, o), seg in zip(pairs, segs, strict=True):
            self._offer(seg, o)

    @property
    def num_samples(self) -> int:
        return self._store.count(0)

    def _offer(self, seg: int, value: int) -> None:
        kept, evicted = self._mem[seg].offer(value)
        if kept:
            self._store.add(seg, value)
        if evicted is not None:
            self._store.remove(seg, evicted)

    def observe(self, finished: FinishedRequests) -> None:
        out = np.asarray(finished.output_tokens, dtype=np.int64).tolist()
        if self._recent is not None:
            prompts = np.asarray(finished.prompt_tokens, dtype=np.int64).tolist()
            self._recent.extend(zip(prompts, out, strict=True))
            self._since_fit += len(out)
        if not self._edges.size:
            for o in out:
                self._offer(0, o)
            self._maybe_refit()
            return
        segs = (np.searchsorted(self._edges, np.asarray(finished.prompt_tokens),
                                side="right") + 1).tolist()
        for o, s in zip(out, segs, strict=True):
            self._offer(0, o)
            self._offer(s, o)
        self._maybe_refit()

    def _maybe_refit(self) -> None:
        if self._recent is not None and self._since_fit >= self.config.auto_bucket_after:
            self._since_fit = 0
            self._refit()

    def segments(self, prompt_tokens: IntArray) -> IntArray:
        """Segment each request is answered from (0: global)."""
        n = len(prompt_tokens)
        if not self._edges.size:
            return np.zeros(n, dtype=np.int64)
        seg = np.searchsorted(self._edges, prompt_tokens, side="right") + 1
        counts = np.array([self._store.count(s) for s in range(len(self._mem))])
        ok = counts[seg] >= self.config.min_bucket_samples
        return np.where(ok, seg, 0).astype(np.int64)

    def answer(self, prompt_tokens: IntArray, decoded: IntArray,
               horizon_steps: int) -> SegmentAnswer:
        """Raw answer (with sample counts) for callers that build on it."""
        return self._store.query(self.segments(prompt_tokens), decoded, horizon_steps)

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        n = len(running)
        if self.num_samples < self.config.min_samples or n == 0:
            return Prediction(p_fin=np.zeros(n), mu_rem=np.full(n, float(horizon_steps)))
        p_fin, mu_rem = self._store.query_fin(self.segments(running.prompt_tokens),
                                              running.decoded_tokens, horizon_steps)
        return Prediction(p_fin=p_fin, mu_rem=mu_rem)
