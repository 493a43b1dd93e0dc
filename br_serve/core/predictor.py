"""The termination-predictor contract used by BR-H (docs/predictors.md).

A predictor answers, for every running request, ``p_fin`` (probability that it finishes
within the next ``H`` steps) and ``mu_rem`` (mean remaining steps given that it does).
Implementations live in the top-level ``predictors`` package; the core ships only the
trivial "survives the window" predictor and the oracle hook used by tests and the
simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from br_serve.core.types import FloatArray, IntArray, RunningRequests


@dataclass(frozen=True, slots=True)
class Prediction:
    """Per-request answer, aligned with the rows of :class:`RunningRequests`.

    Invariants: ``0 <= p_fin <= 1``; ``mu_rem`` is finite and ``>= 0`` where
    ``p_fin > 0`` (its value is irrelevant where ``p_fin == 0``).
    """

    p_fin: FloatArray
    mu_rem: FloatArray


@dataclass(frozen=True, slots=True)
class FinishedRequests:
    """Requests that finished, fed back so predictors can learn online.

    ``output_tokens[j]`` is the true total output of row ``j``.
    """

    prompt_tokens: IntArray
    output_tokens: IntArray
    prefix_hash: IntArray
    finish_s: FloatArray
    hash_ids: tuple[tuple[int, ...] | None, ...] | None = None


@runtime_checkable
class TerminationPredictor(Protocol):
    """Contract every predictor implements.

    ``predict`` must be vectorised over the batch, pure with respect to its inputs
    (apart from reading learned state), and cheap (a few microseconds per request).
    It may raise; BR-H then falls back to the closed gate for that tick.
    ``observe`` receives finished requests; predictors without online learning ignore it.
    """

    name: str

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction: ...

    def observe(self, finished: FinishedRequests) -> None: ...


class SurvivesWindow:
    """Every request is projected to live through the window (``p_fin = 0``).

    This is BR-H's closed gate: with it BR-H only looks at deterministic KV growth.
    """

    name = "survives"

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        n = len(running)
        return Prediction(p_fin=np.zeros(n), mu_rem=np.full(n, float(horizon_steps)))

    def observe(self, finished: FinishedRequests) -> None:
        return None


class OracleHook:
    """Reads the true remaining steps the simulator attaches to the snapshot.

    ``reads_true_remaining`` is the opt-in capability that asks the simulator to fill
    :attr:`RunningRequests.true_remaining_steps` (see :func:`reads_true_remaining`).

    Raises:
        ValueError: the snapshot has no ``true_remaining_steps`` (a real cluster).
    """

    name = "oracle"
    reads_true_remaining = True

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        rem = running.true_remaining_steps
        if rem is None:
            raise ValueError("oracle: the snapshot carries no true_remaining_steps")
        fin = rem <= horizon_steps
        return Prediction(p_fin=fin.astype(np.float64), mu_rem=rem.astype(np.float64))

    def observe(self, finished: FinishedRequests) -> None:
        return None


def reads_true_remaining(predictor: TerminationPredictor) -> bool:
    """Whether ``predictor`` needs the true remaining steps in its snapshots (oracles).

    An opt-in class attribute ``reads_true_remaining = True``; absent means False.
    """
    return bool(getattr(predictor, "reads_true_remaining", False))


def validate_prediction(pred: Prediction, n: int) -> None:
    """Raise ValueError if ``pred`` breaks the contract for a batch of ``n`` requests."""
    p, mu = np.asarray(pred.p_fin), np.asarray(pred.mu_rem)
    if p.shape != (n,) or mu.shape != (n,):
        raise ValueError(f"prediction: shapes {p.shape}/{mu.shape}, expected ({n},)")
    if n == 0:
        return
    # min / max propagate NaN, which fails both comparisons (the tick calls this every
    # time: two reductions instead of four element-wise passes)
    if not (p.min() >= 0.0 and p.max() <= 1.0):
        raise ValueError("prediction: p_fin must lie in [0, 1]")
    if not np.isfinite(mu).all() and not np.isfinite(mu[p > 0]).all():
        raise ValueError("prediction: mu_rem must be finite where p_fin > 0")
