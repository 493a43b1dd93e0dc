"""The predictor of a simulated run, built from its validated configuration."""

from __future__ import annotations

import numpy as np

from br_serve.core import FinishedRequests, TerminationPredictor
from br_serve.sim.config import SimConfig
from br_serve.traces import Trace


def build_predictor(config: SimConfig) -> TerminationPredictor | None:
    """The predictor ``config.predictor`` names for a policy that needs one, else None
    (built here, in the process that runs the simulation; a model file is read once per
    process).

    Raises:
        ValueError: an unreadable model file.
    """
    return config.build_predictor()


def prefix_hashes(hash_ids: tuple[tuple[int, ...] | None, ...] | None, n: int) -> list[int]:
    """One int key per request from its ``hash_ids`` (-1: none).

    Hash of the whole block list; tuples of ints hash the same in every process (no
    PYTHONHASHSEED salt for ints), so runs replay exactly.
    """
    if hash_ids is None:
        return [-1] * n
    return [hash(h) & ((1 << 62) - 1) if h else -1 for h in hash_ids]


def warm_start_from(predictor: TerminationPredictor, trace: Trace) -> None:
    """Feed every request of ``trace`` to ``predictor`` as finished history."""
    n = len(trace)
    predictor.observe(FinishedRequests(
        prompt_tokens=trace.input_tokens, output_tokens=trace.output_tokens,
        prefix_hash=np.asarray(prefix_hashes(trace.hash_ids, n), dtype=np.int64),
        finish_s=np.zeros(n), hash_ids=trace.hash_ids))
