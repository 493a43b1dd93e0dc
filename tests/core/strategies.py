"""Hypothesis strategies and builders for random cluster states and pools."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from br_serve.core import ClusterSnapshot, PoolRequest, PromptPool, RunningRequests


def random_state(rng: np.random.Generator, g: int, slots: int, pool_n: int,
                 kv_limit: int | None = None, dead: int = 0, detail: bool = True
                 ) -> tuple[ClusterSnapshot, PromptPool]:
    """A realistic random state: lognormal prompts, some decoded tokens, a few free slots."""
    reps, prompts, decoded = [], [], []
    running = np.zeros(g, dtype=np.int64)
    for r in range(g):
        n = int(rng.integers(0, slots + 1))
        running[r] = n
        reps += [r] * n
        prompts += rng.lognormal(7.0, 1.2, n).astype(np.int64).tolist()
        decoded += rng.integers(0, 2000, n).tolist()
    rr = RunningRequests.build(reps, prompts, decoded)
    w = rr.prompt_tokens + rr.decoded_tokens
    load = np.bincount(rr.replica, weights=w, minlength=g).astype(np.int64)
    alive = np.ones(g, dtype=bool)
    if dead:
        alive[rng.choice(g, size=dead, replace=False)] = False
    lim = None
    if kv_limit is not None:
        lim = np.maximum(load + rng.integers(0, kv_limit, g), 1)
    cluster = ClusterSnapshot.build(load, running, slots, lim, alive, running=rr if detail
                                    else None)
    pool = PromptPool(capacity=max(pool_n, 1))
    for i in range(pool_n):
        pool.add(PoolRequest(f"q{i}", int(rng.lognormal(7.0, 1.3)), enqueued_s=0.0))
    return cluster, pool


@st.composite
def states(draw: st.DrawFn, max_g: int = 8, kv: bool = False, dead: bool = False
           ) -> tuple[ClusterSnapshot, PromptPool]:
    seed = draw(st.integers(0, 2**32 - 1))
    g = draw(st.integers(1, max_g))
    slots = draw(st.integers(1, 8))
    pool_n = draw(st.integers(0, 40))
    kv_limit = draw(st.sampled_from([None, 500, 5000, 50000])) if kv else None
    n_dead = draw(st.integers(0, g - 1)) if dead and g > 1 else 0
    return random_state(np.random.default_rng(seed), g, slots, pool_n, kv_limit, n_dead)
