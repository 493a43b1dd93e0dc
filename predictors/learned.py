"""The learned predictor: a small two-head MLP over :mod:`predictors.features`.

Heads: a classifier for "finishes within ``H``" (trained with binary cross-entropy,
then Platt-calibrated on a later, held-out slice of the training part) and a regressor
of remaining steps (MSE, only on samples that do finish in the window), output in
``(0, H]``. Training happens in torch (``predictors.train``); inference is plain numpy
(three small matmuls), so the simulator and the scheduler never import torch.

File format: one safetensors file; tensors ``w1 b1 w2 b2 w_cls b_cls w_mu b_mu
feat_mean feat_std``; metadata ``format``, ``version`` and ``config`` (JSON: horizon,
feature names, calibration, the :class:`FeatureConfig`). Loading never unpickles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.core.predictor import FinishedRequests, Prediction
from br_serve.core.types import RunningRequests
from predictors.features import FEATURE_NAMES, FeatureConfig, FeatureState

FORMAT = "br-serve-learned-predictor"
VERSION = "1"
_TENSORS = ("w1", "b1", "w2", "b2", "w_cls", "b_cls", "w_mu", "b_mu", "feat_mean",
            "feat_std")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic
    return out


@dataclass(frozen=True, slots=True)
class LearnedModel:
    """Weights plus what is needed to use them; ``forward`` is the whole inference."""

    tensors: dict[str, np.ndarray]
    horizon: int
    calib_a: float
    calib_b: float
    feature_config: FeatureConfig
    feature_names: tuple[str, ...] = FEATURE_NAMES
    train_info: dict[str, Any] | None = None

    def hidden(self, x: np.ndarray) -> np.ndarray:
        t = self.tensors
        z = (x - t["feat_mean"]) / t["feat_std"]
        h1 = np.maximum(z @ t["w1"] + t["b1"], 0.0)
        out: np.ndarray = np.maximum(h1 @ t["w2"] + t["b2"], 0.0)
        return out

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(p_fin, mu_rem)`` for a ``(n, F)`` feature matrix."""
        h2 = self.hidden(x)
        t = self.tensors
        logit = h2 @ t["w_cls"] + t["b_cls"]
        p = _sigmoid(self.calib_a * logit + self.calib_b)
        mu = _sigmoid(h2 @ t["w_mu"] + t["b_mu"]) * float(max(self.horizon, 1))
        return p.astype(np.float64), mu.astype(np.float64)

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        meta = {
            "format": FORMAT,
            "version": VERSION,
            "config": json.dumps({
                "horizon": self.horizon,
                "calib_a": self.calib_a,
                "calib_b": self.calib_b,
                "feature_names": list(self.feature_names),
                "feature_config": self.feature_config.model_dump(mode="json"),
                "train_info": self.train_info or {},
            }),
        }
        save_file({k: np.ascontiguousarray(v, dtype=np.float32)
                   for k, v in self.tensors.items()}, str(path), metadata=meta)

    @staticmethod
    def load(path: str | Path) -> LearnedModel:
        """Read a model file written by :meth:`save`.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ValueError: ``"<path>: ..."`` for a file that is not such a model, is
                truncated/corrupted, or has missing or mis-shaped tensors.
        """
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"learned: model file {str(p)!r} does not exist")
        from safetensors import safe_open

        try:
            with safe_open(str(p), framework="numpy") as fh:
                meta = fh.metadata() or {}
                tensors = {k: fh.get_tensor(k).astype(np.float64) for k in fh.keys()}  # noqa: SIM118
        except Exception as exc:  # the library raises several types for a bad file
            raise ValueError(f"{p}: not a readable learned-predictor file ({exc})") from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"{p}: not a learned-predictor file (format "
                             f"{meta.get('format')!r}, expected {FORMAT!r})")
        if meta.get("version") != VERSION:
            raise ValueError(f"{p}: model version {meta.get('version')!r}, "
                             f"this code reads {VERSION!r}")
        try:
            cfg = json.loads(meta["config"])
            horizon = int(cfg["horizon"])
            names = tuple(cfg["feature_names"])
            fcfg = FeatureConfig(**cfg["feature_config"])
            calib_a, calib_b = float(cfg["calib_a"]), float(cfg["calib_b"])
        except Exception as exc:
            raise ValueError(f"{p}: bad model config metadata ({exc})") from None
        if names != FEATURE_NAMES:
            raise ValueError(f"{p}: trained on features {names}, this code computes "
                             f"{FEATURE_NAMES}")
        missing = [k for k in _TENSORS if k not in tensors]
        if missing:
            raise ValueError(f"{p}: missing tensors {', '.join(missing)}")
        model = LearnedModel(tensors, horizon, calib_a, calib_b, fcfg, names,
                             cfg.get("train_info"))
        try:  # shapes: run a dummy batch through
            pz, mz = model.forward(np.zeros((2, len(names))))
            if pz.shape != (2,) or mz.shape != (2,):
                raise ValueError("heads do not produce one value per row")
        except ValueError as exc:
            raise ValueError(f"{p}: inconsistent tensor shapes ({exc})") from None
        return model


#: models read in this process, by (resolved path, mtime, size)
_LOADED: dict[tuple[str, int, int], LearnedModel] = {}


def _load_once(path: str | Path) -> LearnedModel:
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return LearnedModel.load(p)  # its error names the file
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    model = _LOADED.get(key)
    if model is None:
        model = _LOADED[key] = LearnedModel.load(p)
    return model


class LearnedPredictor:
    """``TerminationPredictor`` over a :class:`LearnedModel` and online feature state.

    ``predict`` raises ``ValueError`` when asked for a horizon other than the one the
    model was trained for (BR-H then uses the closed gate for that tick).
    """

    name = "learned"

    def __init__(self, model: LearnedModel, *, rng: np.random.Generator | None = None) -> None:
        self.model = model
        self.state = FeatureState(model.feature_config, rng=rng)

    @classmethod
    def load(cls, path: str | Path, *, horizon: int | None = None,
             rng: np.random.Generator | None = None) -> LearnedPredictor:
        """A predictor over the model in ``path``: the file is read once per process
        (again only if it changed); each predictor keeps its own online state."""
        model = _load_once(path)
        if horizon is not None and horizon != model.horizon:
            raise ValueError(f"{path}: model trained for horizon {model.horizon}, "
                             f"asked for horizon {horizon}")
        return cls(model, rng=rng)

    def observe(self, finished: FinishedRequests) -> None:
        self.state.observe(finished)

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        if horizon_steps != self.model.horizon:
            raise ValueError(f"learned: trained for horizon {self.model.horizon}, "
                             f"asked for {horizon_steps}")
        n = len(running)
        if n == 0:
            return Prediction(np.zeros(0), np.zeros(0))
        p, mu = self.model.forward(self.state.features(running, horizon_steps))
        return Prediction(p_fin=p, mu_rem=mu)
