"""Seeded synthetic workloads: lognormal / Pareto lengths, Poisson / bursty arrivals.

Same spec, same seed -> the same trace (one ``numpy.random.Generator`` drawn in a
fixed order). Bursty arrivals are a two-state modulated Poisson process: bursts of
rate ``rate_per_s * burst_factor`` alternate with calm periods at a rate chosen so the
long-run mean stays ``rate_per_s``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from br_serve.traces.trace import IntArray, Trace


class LengthDist(BaseModel):
    """Token-length distribution, clipped to ``[min_tokens, max_tokens]``.

    ``lognormal``: median ``median`` and log-space sigma ``sigma``.
    ``pareto``: Pareto (Lomax shifted by ``min_tokens``) with tail index ``alpha``,
    scaled so that its median is ``median``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["lognormal", "pareto"] = "lognormal"
    median: float = Field(default=512.0, gt=0)
    sigma: float = Field(default=1.0, ge=0)
    alpha: float = Field(default=1.5, gt=0)
    min_tokens: int = Field(default=1, ge=0)
    max_tokens: int = Field(default=32768, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> LengthDist:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens: exceeds max_tokens")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        if self.kind == "lognormal":
            x = rng.lognormal(np.log(self.median), self.sigma, n)
        else:
            # Lomax median is (2^(1/alpha) - 1) * scale.
            scale = self.median / (2.0 ** (1.0 / self.alpha) - 1.0)
            x = rng.pareto(self.alpha, n) * scale
        out: IntArray = np.clip(np.rint(x), self.min_tokens, self.max_tokens).astype(np.int64)
        return out


class SyntheticSpec(BaseModel):
    """A synthetic workload; validated, immutable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int = Field(default=1000, ge=1)
    input: LengthDist = LengthDist(median=1024, sigma=1.0)
    output: LengthDist = LengthDist(median=512, sigma=1.0, min_tokens=1)
    arrival: Literal["poisson", "bursty", "saturated"] = "poisson"
    rate_per_s: float = Field(default=10.0, gt=0)
    burst_factor: float = Field(default=5.0, ge=1)
    burst_share: float = Field(default=0.2, gt=0, lt=1)
    mean_period_s: float = Field(default=10.0, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _outputs_positive(self) -> SyntheticSpec:
        if self.output.min_tokens < 1:
            raise ValueError("output.min_tokens: must be >= 1")
        if self.arrival == "bursty" and self.burst_factor * self.burst_share >= 1:
            raise ValueError("burst_factor: burst_factor * burst_share must be < 1")
        return self


def _arrivals(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    n = spec.requests
    if spec.arrival == "saturated":
        return np.zeros(n)
    if spec.arrival == "poisson":
        gaps = rng.exponential(1.0 / spec.rate_per_s, n)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    # Bursty: alternate calm/burst periods (exponential lengths); within a period the
    # arrivals are Poisson at that period's rate.
    hi = spec.rate_per_s * spec.burst_factor
    lo = spec.rate_per_s * (1 - spec.burst_factor * spec.burst_share) / (1 - spec.burst_share)
    times: list[np.ndarray] = []
    t, got, burst = 0.0, 0, False
    while got < n:
        share = spec.burst_share if burst else 1 - spec.burst_share
        length = rng.exponential(spec.mean_period_s * share * 2)
        rate = hi if burst else lo
        k = int(rng.poisson(rate * length))
        if k:
            times.append(np.sort(rng.uniform(t, t + length, k)))
            got += k
        t += length
        burst = not burst
    arr: np.ndarray = np.concatenate(times)[:n]
    out: np.ndarray = arr - arr[0]
    return out


def synthetic_trace(spec: SyntheticSpec) -> Trace:
    """Draw ``spec.requests`` requests: inputs, outputs, then arrivals, from ``spec.seed``."""
    rng = np.random.default_rng(spec.seed)
    inp = spec.input.sample(rng, spec.requests)
    out = spec.output.sample(rng, spec.requests)
    arr = _arrivals(spec, rng)
    return Trace.build(arr, inp, out, None, source=f"synthetic:{spec.arrival}:seed{spec.seed}")
