"""Perturbed replays of one trace, shared by every policy of an ensemble (pairing).

Modes (``replay_mode``):

- ``window``: replay ``r`` is a contiguous window of ``limit`` requests. The admissible
  starts ``[0, n - limit]`` are cut into K equal strata and replay ``r`` draws its start
  uniformly inside stratum ``r`` (seeded), so windows spread over the whole trace and
  overlap only when ``K * limit > n``. The saturated default.
- ``jitter``: the first ``limit`` requests (all, if ``limit`` is None), every arrival
  moved by independent Gaussian noise of s.d. ``jitter_ms`` (clipped at 0, re-sorted,
  re-zeroed). The trace-timed default.
- ``seed``: the first ``limit`` requests, unchanged; only the simulation seed differs.
- ``none``: one replay of the first ``limit`` requests (``replays`` must be 1): what
  ``br-serve sim`` does without ``--replays``.

Replay ``r`` is always simulated with seed ``seed + r`` (the policy's generator and the
predictors), in every mode, so a stochastic policy is resampled too. The perturbation
generator of replay ``r`` is ``numpy.random.default_rng([seed, r, mode_code])``: the
replays do not depend on K's neighbours, on ``jobs`` or on the policies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from br_serve.traces import Trace

REPLAY_MODES = ("window", "jitter", "seed", "none")
_CODE = {m: i for i, m in enumerate(REPLAY_MODES)}


@dataclass(frozen=True, slots=True)
class Replay:
    """One perturbed replay: its index, the trace to simulate, the seed to simulate it
    with, and where it came from (``start``: first row of its window in the source)."""

    index: int
    trace: Trace
    seed: int
    start: int
    mode: str


def validate_replay_args(mode: str, replays: int, n: int, limit: int | None,
                         jitter_ms: float) -> None:
    """Raise ``ValueError`` naming the field for any bad combination (see the module)."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"replay_mode: unknown {mode!r}; known: {', '.join(REPLAY_MODES)}")
    if replays < 1:
        raise ValueError(f"replays: must be >= 1 (got {replays})")
    if mode == "none" and replays != 1:
        raise ValueError(f"replays: mode 'none' is a single replay (got {replays})")
    if limit is not None and limit < 1:
        raise ValueError(f"limit: must be >= 1 (got {limit})")
    if n == 0:
        raise ValueError("trace: no requests")
    if mode == "window":
        if limit is None:
            raise ValueError("limit: replay mode 'window' needs the window length (--limit)")
        if n < limit:
            raise ValueError(f"limit: the trace has {n} requests, fewer than one window of "
                             f"{limit}; lower --limit or use a longer trace")
    if mode == "jitter" and not jitter_ms > 0:
        raise ValueError(f"jitter_ms: replay mode 'jitter' needs jitter_ms > 0 "
                         f"(got {jitter_ms})")
    if jitter_ms < 0:
        raise ValueError(f"jitter_ms: must be >= 0 (got {jitter_ms})")


def make_replays(trace: Trace, mode: str, replays: int, *, limit: int | None = None,
                 seed: int = 0, jitter_ms: float = 0.0) -> list[Replay]:
    """The ``replays`` perturbed copies of ``trace`` (see the module docstring).

    Raises:
        ValueError: an unknown mode, ``replays < 1``, a window longer than the trace,
            ``jitter`` without a positive ``jitter_ms`` (each message names the field).
    """
    n = len(trace)
    validate_replay_args(mode, replays, n, limit, jitter_ms)
    width = n if limit is None else min(limit, n)
    head = trace if width == n else trace.take(np.arange(width))
    out: list[Replay] = []
    for r in range(replays):
        rng = np.random.default_rng([seed, r, _CODE[mode]])
        if mode == "window":
            span = n - width + 1  # admissible starts
            lo = (r * span) // replays
            hi = max(lo + 1, ((r + 1) * span) // replays)
            start = int(rng.integers(lo, hi))
            tr = trace.take(np.arange(start, start + width))
            out.append(Replay(r, tr, seed + r, start, mode))
        elif mode == "jitter":
            noise = rng.normal(0.0, jitter_ms / 1e3, width)
            arr = np.maximum(head.arrival_s + noise, 0.0)
            tr = Trace.build(arr, head.input_tokens, head.output_tokens, head.hash_ids,
                             source=head.source, skipped_lines=head.skipped_lines,
                             dropped_rows=head.dropped_rows)
            out.append(Replay(r, tr, seed + r, 0, mode))
        else:
            out.append(Replay(r, head, seed + r, 0, mode))
    return out
