"""Small synthetic traces with a learnable structure (no real trace is copied)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from br_serve.core.types import FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class SynthTrace:
    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    hash_ids: tuple[tuple[int, ...], ...] | None


def family_trace(n: int = 600, families: int = 30, seed: int = 0,
                 with_hash_ids: bool = True) -> SynthTrace:
    """Requests from ``families`` prompt families; each family has a typical output.

    Output lengths: the family's mean (lognormal across families) times lognormal noise,
    so a prefix key predicts the output and the global distribution is wide.
    """
    rng = np.random.default_rng(seed)
    fam_mean = np.exp(rng.normal(4.5, 1.0, families))
    fam = rng.integers(0, families, n)
    out = np.maximum(1, (fam_mean[fam] * np.exp(rng.normal(0, 0.15, n)))).astype(np.int64)
    arr = np.cumsum(rng.exponential(0.5, n))
    arr -= arr[0]
    inp = rng.integers(100, 3000, n)
    hid = tuple((0, 1000 + int(f), 5000 + j) for j, f in enumerate(fam)) if with_hash_ids \
        else None
    return SynthTrace(arr, inp.astype(np.int64), out, hid)
