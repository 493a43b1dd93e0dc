"""Calibration and ranking metrics for termination predictions (pure numpy).

All functions take ``y`` (0/1 labels: "finishes within H") and ``p`` (predicted
``p_fin``) of equal length and raise ``ValueError`` on mismatched or empty input.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def _check(y: npt.ArrayLike, p: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    ya = np.asarray(y, dtype=np.float64)
    pa = np.asarray(p, dtype=np.float64)
    if ya.shape != pa.shape or ya.ndim != 1:
        raise ValueError(f"metrics: labels {ya.shape} and predictions {pa.shape} differ")
    if ya.size == 0:
        raise ValueError("metrics: no samples")
    return ya, pa


def auc(y: npt.ArrayLike, p: npt.ArrayLike) -> float:
    """Area under the ROC curve (Mann-Whitney, ties count one half); NaN if one class."""
    ya, pa = _check(y, p)
    pos = ya > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(pa, kind="mergesort")
    sorted_p = pa[order]
    ranks = np.empty(pa.size, dtype=np.float64)
    # average rank of each group of tied scores (1-based)
    _, start, counts = np.unique(sorted_p, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def brier(y: npt.ArrayLike, p: npt.ArrayLike) -> float:
    """Mean squared error of the probabilities."""
    ya, pa = _check(y, p)
    return float(np.mean((pa - ya) ** 2))


def ece(y: npt.ArrayLike, p: npt.ArrayLike, bins: int = 10) -> float:
    """Expected calibration error over ``bins`` equal-width bins of ``p`` in [0, 1].

    ``sum_b (n_b / n) * |mean(y in b) - mean(p in b)|``; ``p = 1`` falls in the last bin.
    """
    ya, pa = _check(y, p)
    idx = np.clip((pa * bins).astype(np.int64), 0, bins - 1)
    n = np.bincount(idx, minlength=bins).astype(np.float64)
    sy = np.bincount(idx, weights=ya, minlength=bins)
    sp = np.bincount(idx, weights=pa, minlength=bins)
    nz = n > 0
    return float(np.sum(np.abs(sy[nz] - sp[nz])) / ya.size)


def mu_rem_mae(remaining: npt.ArrayLike, mu: npt.ArrayLike, finishes: npt.ArrayLike) -> float:
    """Mean |predicted - true| remaining steps over samples that do finish in the window."""
    r = np.asarray(remaining, dtype=np.float64)
    m = np.asarray(mu, dtype=np.float64)
    f = np.asarray(finishes, dtype=bool)
    if not (r.shape == m.shape == f.shape):
        raise ValueError("metrics: remaining, mu and labels differ in shape")
    if not f.any():
        return float("nan")
    return float(np.mean(np.abs(m[f] - r[f])))


def report(y: npt.ArrayLike, p: npt.ArrayLike, remaining: npt.ArrayLike,
           mu: npt.ArrayLike) -> dict[str, float | int]:
    """The standard table row: auc, brier, ece, mu_rem_mae, n_samples, positive_rate."""
    ya, pa = _check(y, p)
    return {
        "auc": auc(ya, pa),
        "brier": brier(ya, pa),
        "ece": ece(ya, pa),
        "mu_rem_mae": mu_rem_mae(remaining, mu, ya > 0.5),
        "n_samples": int(ya.size),
        "positive_rate": float(ya.mean()),
    }
