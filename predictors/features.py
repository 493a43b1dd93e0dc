"""Features of a running request from what a router knows at that moment.

Never the true output length: only the prompt length, the decoded steps ``a``, the
online survival and prefix-key statistics of requests that already finished, and the
recent arrival rate. :class:`FeatureState` is the online state behind them; the same
class computes training features (during a trace replay) and serving features, so the
two cannot drift apart.

Arrival rate: arrivals are learned from the running batches themselves (each request id
is logged once, with its ``arrival_s``); the rate of request ``i`` is the number of logged
arrivals in ``[arrival_i - rate_window_s, arrival_i]`` per minute. A request waiting in
the pool is not yet visible, so the serving value can lag the replay value slightly.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from br_serve.core.predictor import FinishedRequests
from br_serve.core.types import RunningRequests
from predictors.exact import ExactMatchPredictor, ExactOptions
from predictors.survival import SurvivalOptions, SurvivalPredictor

FEATURE_NAMES = (
    "log_prompt",
    "log_decoded",
    "log_decoded_over_h",
    "surv_p_fin",
    "surv_mu_over_h",
    "surv_alive_frac",
    "key_known",
    "log_key_count",
    "exact_p_fin",
    "exact_mu_over_h",
    "key_alive_frac",
    "log_key_mean",
    "key_mean_minus_a_over_h",
    "log_rate_per_min",
)


class FeatureConfig(BaseModel):
    """Online-state options stored with a trained model (validated, immutable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    survival: SurvivalOptions = SurvivalOptions(min_samples=1)
    exact: ExactOptions = ExactOptions(survival=SurvivalOptions(min_samples=1))
    rate_window_s: float = Field(default=60.0, gt=0)
    max_logged_ids: int = Field(default=65536, ge=1)


class FeatureState:
    """Online statistics behind the features; ``observe`` it like a predictor."""

    def __init__(self, config: FeatureConfig | None = None, *,
                 rng: np.random.Generator | None = None) -> None:
        self.config = config or FeatureConfig()
        # The exact predictor embeds its own survival fallback; its survival config is
        # the one reported as the survival features.
        self.exact = ExactMatchPredictor(self.config.exact, rng=rng)
        self.survival: SurvivalPredictor = self.exact.fallback
        self._ids: set[str] = set()
        self._id_order: deque[str] = deque()
        self._arrivals = np.zeros(0, dtype=np.float64)  # sorted

    def observe(self, finished: FinishedRequests) -> None:
        self.exact.observe(finished)

    def _log_arrivals(self, running: RunningRequests) -> None:
        ids = running.request_ids
        if not ids:
            return
        new = [j for j, rid in enumerate(ids) if rid not in self._ids]
        if not new:
            return
        for j in new:
            self._ids.add(ids[j])
            self._id_order.append(ids[j])
        while len(self._id_order) > self.config.max_logged_ids:
            self._ids.discard(self._id_order.popleft())
        add = np.sort(running.arrival_s[new])
        arr = np.insert(self._arrivals, np.searchsorted(self._arrivals, add), add)
        # Only the last few windows matter for the rate.
        keep_from = arr[-1] - 4 * self.config.rate_window_s
        self._arrivals = arr[np.searchsorted(arr, keep_from):]

    def features(self, running: RunningRequests, horizon_steps: int) -> np.ndarray:
        """``(n, len(FEATURE_NAMES))`` float64 matrix, rows aligned with ``running``."""
        self._log_arrivals(running)
        h = float(max(horizon_steps, 1))
        s = running.prompt_tokens.astype(np.float64)
        a = running.decoded_tokens.astype(np.float64)
        surv = self.survival.answer(running.prompt_tokens, running.decoded_tokens,
                                    horizon_steps)
        segs = self.exact.key_segments(running.hash_ids, running.prefix_hash)
        kans, use = self.exact.key_answer(segs, running.decoded_tokens, horizon_steps)
        known = (segs >= 0) & (kans.total > 0)
        ex_p = np.where(use, kans.p_fin, surv.p_fin)
        ex_mu = np.where(use, kans.mu_rem, surv.mu_rem)
        key_alive = np.where(known, kans.alive / np.maximum(kans.total, 1), 0.0)
        key_mean = np.where(known, kans.mean_all, 0.0)
        w = self.config.rate_window_s
        arr = running.arrival_s
        rate = (np.searchsorted(self._arrivals, arr, side="right")
                - np.searchsorted(self._arrivals, arr - w, side="left")) * (60.0 / w)
        cols = (
            np.log1p(s),
            np.log1p(a),
            np.log1p(a / h),
            surv.p_fin,
            surv.mu_rem / h,
            surv.alive / np.maximum(surv.total, 1),
            known.astype(np.float64),
            np.log1p(np.where(known, kans.total, 0)),
            ex_p,
            ex_mu / h,
            key_alive,
            np.log1p(key_mean),
            np.where(known, np.clip((key_mean - a) / h, -10.0, 10.0), 0.0),
            np.log1p(rate),
        )
        return np.stack(cols, axis=1)
