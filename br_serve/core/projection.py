"""BR-H's projection of the replica loads over the window, with the pool's refills.

BR-H scores a replica by its margins ``M(h) - L_g(h)`` over the next ``H`` steps. The
plain projection (:func:`br_serve.core.fscore.projected_loads`) leaves a slot empty
from the step its request is projected to finish. That is right where nothing waits
to take the slot (a shallow pool) and wrong where the pool refills it at once: on a
saturated cluster with long prompts the refill restores most of the load, and the
empty projection shows phantom room (docs/core.md, "BR-H projection").

:func:`refill_rollout` replays the refills the tick itself would make, in time order:
each projected finish frees its slot at step ``r``, and the slot is refilled at ``r``
with the pool prompt BR-0's Stage 1 would choose for that replica's projected margin
at ``r`` (the larger F of the largest prompt within the margin and the smallest one
above it), without replacement. Refills stop when the pool's untaken prompts run out
(or at ``max_refills``), so a shallow pool projects empty slots and a deep one refilled
slots: the regime is read from the pool, not configured.

:class:`Projection` keeps, per replica, the *target* loads (the refills included) and
the *base* loads (the replica's own refills at the smallest pool prompt). A request
admitted now to a replica whose slot will be refilled at ``f_g`` displaces part of that
refill: past ``f_g`` the refill shrinks by what was admitted, so admitting ``D`` adds
no load there until the base load passes the target, and the replica's score counts
the fill only before ``f_g`` (see :class:`br_serve.core.horizon.GrowingScore`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from br_serve.core.fscore import f_score
from br_serve.core.types import FloatArray, IntArray


@dataclass(slots=True)
class Projection:
    """BR-H's view of the window: ``loads`` ``(G, H+1)`` (refills included), whether
    the predictor answered usably, and with refills the ``base`` loads (each replica's
    own refills at the smallest pool prompt) and each replica's first refill step."""

    loads: FloatArray
    ok: bool = True
    base: FloatArray | None = None
    first: list[int] | None = None
    refills: int = 0


@dataclass(frozen=True, slots=True)
class Refill:
    """A projected refill: replica ``replica``'s slot freed at step ``step`` takes a
    ``prompt_tokens`` prompt from the pool (the rollout's choice)."""

    step: int
    replica: int
    prompt_tokens: int


def refill_rollout(replica: IntArray, weight_tokens: IntArray, end_step: IntArray,
                   alive: list[bool], horizon: int, sizes: list[int],
                   max_refills: int | None = None) -> list[Refill]:
    """The refills of every projected in-window finish, in time order (module docstring).

    ``end_step[i]`` is the first step request ``i`` no longer runs (``> horizon``:
    survives). Ties in time are refilled in replica order. The envelope used for each
    margin is the projected maximum over ``alive`` replicas at that step, refills made
    so far included. ``sizes`` is the pool's ascending prompt list (not mutated).
    """
    g = len(alive)
    w = [0.0] * g
    n = [0] * g
    rep_l = replica.tolist()
    for r, x in zip(rep_l, weight_tokens.tolist(), strict=True):
        w[r] += x
        n[r] += 1
    fin = np.flatnonzero(end_step <= horizon)
    if fin.size == 0 or not sizes:
        return []
    order = fin[np.lexsort((replica[fin], end_step[fin]))]
    ends = end_step[order].tolist()
    reps = replica[order].tolist()
    wts = weight_tokens[order].tolist()
    alive_idx = [k for k in range(g) if alive[k]]
    replicas = max(1, len(alive_idx))
    taken: set[int] = set()
    left = len(sizes) if max_refills is None else min(len(sizes), max_refills)
    out: list[Refill] = []
    j = 0
    while j < len(ends) and left > 0:
        r = max(0, ends[j])
        k = j
        while k < len(ends) and max(0, ends[k]) == r:  # every finish at r first
            w[reps[k]] -= wts[k]
            n[reps[k]] -= 1
            k += 1
        top = max((w[a] + n[a] * r for a in alive_idx), default=0.0)
        for e in range(j, k):
            if left <= 0:
                break
            rg = reps[e]
            if not alive[rg]:
                continue
            load = w[rg] + n[rg] * r
            pos = _pick(sizes, taken, top - load, replicas)
            if pos < 0:
                left = 0
                break
            taken.add(pos)
            left -= 1
            x = sizes[pos]
            out.append(Refill(r, rg, x))
            w[rg] += x - r  # contributes x + (h - r) from step r on
            n[rg] += 1
            top = max(top, load + x)
        j = k
    return out


def _pick(sizes: list[int], taken: set[int], margin: float, replicas: int) -> int:
    """BR-0's Stage 1 choice for ``margin``: the better F of the largest untaken prompt
    within it and the smallest above it (the smaller on a tie); -1 if none is left."""
    below = bisect_right(sizes, margin) - 1
    while below >= 0 and below in taken:
        below -= 1
    above = bisect_right(sizes, margin)
    while above < len(sizes) and above in taken:
        above += 1
    if above >= len(sizes):
        return below
    if below < 0:
        return above
    fa = f_score(float(sizes[above]), margin, replicas)
    fb = f_score(float(sizes[below]), margin, replicas)
    return above if fa > fb else below


def refill_arrays(refills: list[Refill], replicas: int, horizon: int
                  ) -> tuple[FloatArray, FloatArray, FloatArray, list[int]]:
    """``(loads, prompts, counts, first)`` of the refills: ``loads[g, h]`` = their load
    at step ``h`` (``x + h - r`` from ``r`` on), ``prompts[g, h]`` / ``counts[g, h]`` =
    their prompt tokens / number in place at ``h``, ``first[g]`` = the first refill step
    on ``g`` (``horizon + 1``: none)."""
    width = horizon + 2
    first = [horizon + 1] * replicas
    if not refills:
        z = np.zeros((replicas, horizon + 1))
        return z, z.copy(), z.copy(), first
    bins = np.fromiter((f.replica * width + f.step for f in refills), dtype=np.int64,
                       count=len(refills))
    x = np.fromiter((f.prompt_tokens for f in refills), dtype=np.float64, count=len(refills))
    st = np.fromiter((f.step for f in refills), dtype=np.float64, count=len(refills))
    n_bins = replicas * width
    dx = np.bincount(bins, weights=x, minlength=n_bins).reshape(replicas, width)
    dw = np.bincount(bins, weights=x - st, minlength=n_bins).reshape(replicas, width)
    dn = np.bincount(bins, minlength=n_bins).reshape(replicas, width)
    h = np.arange(horizon + 1, dtype=np.float64)
    prompts: FloatArray = np.cumsum(dx, axis=1, dtype=np.float64)[:, : horizon + 1]
    counts: FloatArray = np.cumsum(dn, axis=1)[:, : horizon + 1].astype(np.float64)
    loads: FloatArray = np.cumsum(dw, axis=1)[:, : horizon + 1] + counts * h
    for f in refills:
        if f.step < first[f.replica]:
            first[f.replica] = f.step
    return loads, prompts, counts, first
