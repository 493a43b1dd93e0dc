"""Online calibration of each replica's step-time coefficients ``(a_g, b_g, c_g)``.

Every decode step gives, per replica, its KV load ``L`` (tokens), its running requests
``N`` and the compute time it measured ``t`` (seconds, barrier wait excluded). The
model is ``t = a L + c N + b``. :class:`StepCalibrator` fits it per replica, online,
with three properties a live cluster needs:

- **It follows drift, precisely when steady.** Exponential forgetting with a long
  memory while the replica is steady (``forget``), and a short one for a few dozen
  steps after a change detector fires (a lasting shift of the residuals), so a
  replica that slows down mid-run is re-fitted within tens of steps.
- **Outliers do not move it.** Each step's residual is compared with a running robust
  scale (an exponentially weighted mean absolute residual); a step further out than
  ``outlier_k`` scales gets a Huber weight ``k s / |r|`` instead of 1, so a rare 10x
  step (a GC pause, a noisy neighbour) barely registers and does not trip the drift
  detector, which needs several shifted steps.
- **It stays anchored where the data says nothing.** A saturated replica runs the same
  ``N`` every step, so ``c`` and ``b`` cannot be told apart from its data; plain
  recursive least squares with forgetting then lets the covariance blow up in that
  direction. Here the information matrix keeps a fraction ``1 - forget`` of a prior
  (the configured coefficients, weak by default) every step, so unexcited directions
  relax to the prior instead of drifting, and excited ones follow the data.

The fit is in information form (``R theta = z``, 3x3 per replica, solved in one batched
call), on features scaled to O(1) so that loads of 1e5 tokens and ``N`` of 16 are
conditioned alike. Pure numpy; the clock and everything else is the caller's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from br_serve.core.options import Options, option
from br_serve.core.step import StepModel
from br_serve.core.types import ClusterSnapshot, FloatArray


@dataclass(frozen=True, slots=True)
class CalibrationOptions(Options):
    """Knobs of :class:`StepCalibrator` (defaults suit steps of 10-100 ms).

    While a replica is steady the fit forgets slowly (``forget``); for ``drift_steps``
    after a drift is detected (a lasting shift of the residuals: their exponentially
    weighted mean, at rate ``drift_rate``, beyond ``drift_threshold`` robust scales) it
    forgets fast (``drift_forget``), so a replica that slows down is re-fitted within
    tens of steps.
    """

    forget: float = option(0.995, gt=0.5, le=1.0, doc="forgetting factor while the "
                           "replica is steady (0.995: a memory of about 200 steps)")
    drift_forget: float = option(0.9, gt=0.5, le=1.0, doc="forgetting factor for "
                                 "drift_steps after a drift is detected")
    drift_steps: int = option(30, ge=1, doc="steps of fast forgetting after a drift")
    drift_rate: float = option(0.1, gt=0, lt=1, doc="rate of the residuals' exponentially "
                               "weighted mean that detects a drift")
    drift_threshold: float = option(1.0, gt=0, doc="a drift is that mean beyond this many "
                                    "robust scales")
    prior_weight: float = option(0.05, gt=0, doc="how many steps' worth of evidence the "
                                 "prior is (small: the data takes over wherever it is "
                                 "informative)")
    outlier_k: float = option(4.0, gt=0, doc="residuals beyond this many robust scales get "
                              "a Huber weight")
    scale_rate: float = option(0.05, gt=0, lt=1, doc="rate of the robust residual scale")
    load_scale_tokens: float = option(1e5, gt=0, doc="feature scaling of the load (only "
                                      "conditions the numerics)")
    running_scale: float = option(16.0, gt=0, doc="feature scaling of the running count "
                                  "(only conditions the numerics)")
    min_steps: int = option(20, ge=1, doc="a replica counts as calibrated after this many "
                            "measured steps")


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Fitted per-replica step coefficients (seconds per token, per request, per step)
    and how many steps each fit has seen."""

    a_s_per_token: FloatArray
    b_s: FloatArray
    c_s_per_request: FloatArray
    steps: npt.NDArray[np.int64]
    calibrated: npt.NDArray[np.bool_]

    def step_time_s(self, load_tokens: npt.ArrayLike, running: npt.ArrayLike) -> FloatArray:
        """Predicted compute time of each replica for the given loads and counts."""
        out: FloatArray = (self.a_s_per_token * np.asarray(load_tokens, dtype=np.float64)
                           + self.c_s_per_request * np.asarray(running, dtype=np.float64)
                           + self.b_s)
        return out


class StepCalibrator:
    """Per-replica online fit of ``t = a L + c N + b`` (see the module docstring).

    ``prior`` (default: :class:`StepModel`'s defaults) is the configured model the fit
    starts from and relaxes to where data is silent.

    Raises:
        ValueError: ``replicas < 1``, or a prior with a per-replica coefficient of the
            wrong length.
    """

    def __init__(self, replicas: int, prior: StepModel | None = None,
                 options: CalibrationOptions | None = None) -> None:
        if replicas < 1:
            raise ValueError("replicas: must be >= 1")
        self.g = replicas
        self.opts = options or CalibrationOptions()
        o = self.opts
        self._scale = np.array([o.load_scale_tokens, o.running_scale, 1.0])
        a, b, c = (prior or StepModel()).arrays(replicas)
        # the fit's parameter order follows its features (L, N, 1): (a, c, b)
        prior_theta = np.stack([a, c, b], axis=1)
        # in scaled units: theta_s = theta * scale (so that x_s . theta_s = x . theta)
        self._prior_s = prior_theta * self._scale
        # prior precision: worth prior_weight steps of data in each (scaled) direction;
        # scaled features are O(1), so one step adds O(1) per direction
        typical = np.maximum(self._prior_s.sum(axis=1), 1e-3)
        self._r0 = np.broadcast_to(o.prior_weight * np.eye(3), (replicas, 3, 3)).copy()
        self._z0 = np.einsum("gij,gj->gi", self._r0, self._prior_s)
        self._r = self._r0.copy()
        self._z = self._z0.copy()
        self._theta_s = self._prior_s.copy()
        self._abs_res = 0.05 * typical  # robust residual scale, seconds
        self._drift = np.zeros(replicas)  # EWMA of normalised residuals
        self._drift_left = np.zeros(replicas, dtype=np.int64)  # fast-forgetting steps
        self._steps = np.zeros(replicas, dtype=np.int64)

    def update(self, load_tokens: npt.ArrayLike, running: npt.ArrayLike,
               compute_s: npt.ArrayLike, mask: npt.ArrayLike | None = None) -> None:
        """Feed one step's measurements (one value per replica).

        ``mask`` selects the replicas that stepped (dead or idle ones are left out);
        non-finite or negative times are ignored.
        """
        o = self.opts
        x = np.stack([np.asarray(load_tokens, dtype=np.float64),
                      np.asarray(running, dtype=np.float64),
                      np.ones(self.g)], axis=1) / self._scale
        t = np.asarray(compute_s, dtype=np.float64)
        use = np.isfinite(t) & (t >= 0)
        if mask is not None:
            use &= np.asarray(mask, dtype=bool)
        if not use.any():
            return
        t = np.where(use, t, 0.0)
        res = t - np.einsum("gi,gi->g", x, self._theta_s)
        scale = np.maximum(self._abs_res, 1e-9)
        # drift: a lasting shift of the (clipped, normalised) residuals, not one spike
        z = np.clip(res / scale, -o.outlier_k, o.outlier_k)
        self._drift = np.where(use, (1 - o.drift_rate) * self._drift + o.drift_rate * z,
                               self._drift)
        hit = use & (np.abs(self._drift) > o.drift_threshold)
        self._drift_left = np.where(hit, o.drift_steps, self._drift_left)
        self._drift = np.where(hit, 0.0, self._drift)
        drifting = self._drift_left > 0
        # Huber weights: bounded influence for any one step, drifting or not
        lim = o.outlier_k * scale
        w = np.where(np.abs(res) > lim, lim / np.maximum(np.abs(res), 1e-300), 1.0)
        w = np.where(use, w, 0.0)
        lam = np.where(use, np.where(drifting, o.drift_forget, o.forget), 1.0)[:, None]
        keep = (1.0 - lam)[:, :, None]
        self._r = (lam[:, :, None] * self._r + keep * self._r0
                   + w[:, None, None] * np.einsum("gi,gj->gij", x, x))
        self._z = (lam * self._z + keep[:, :, 0] * self._z0 + (w * t)[:, None] * x)
        self._theta_s = np.linalg.solve(self._r, self._z[:, :, None])[:, :, 0]
        # robust scale: sqrt(pi/2) E|r| is sigma for Gaussian noise; clipped residuals let
        # it grow by at most ~20% a step, so a lasting change widens it and is followed
        # while one spike barely moves it
        clipped = np.minimum(np.abs(res), lim)
        self._abs_res = np.where(use, (1 - o.scale_rate) * self._abs_res
                                 + o.scale_rate * 1.2533 * clipped, self._abs_res)
        self._drift_left = np.where(use & drifting, self._drift_left - 1, self._drift_left)
        self._steps += use

    def coefficients(self) -> Coefficients:
        """The current fit, clipped at 0 (a cost is never negative)."""
        th = np.maximum(self._theta_s / self._scale, 0.0)
        return Coefficients(a_s_per_token=th[:, 0].copy(), b_s=th[:, 2].copy(),
                            c_s_per_request=th[:, 1].copy(), steps=self._steps.copy(),
                            calibrated=self._steps >= self.opts.min_steps)

    def residual_scale_s(self) -> FloatArray:
        """The robust scale of each replica's recent residuals (seconds)."""
        out: FloatArray = self._abs_res.copy()
        return out


def _frozen(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out = np.array(a, dtype=np.float64, copy=True)
    out.flags.writeable = False
    return out


def with_coefficients(snap: ClusterSnapshot, coef: Coefficients) -> ClusterSnapshot:
    """``snap`` with the fitted step coefficients in place of the configured ones (what
    a driver hands a policy that needs calibrated step costs)."""
    return dataclasses.replace(snap, step_a_s_per_token=_frozen(coef.a_s_per_token),
                               step_b_s=_frozen(coef.b_s),
                               step_c_s_per_request=_frozen(coef.c_s_per_request))
