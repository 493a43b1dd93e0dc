"""Training of the learned predictor on a trace, with a time-ordered split.

Split (no leakage from the future): requests are ordered by arrival; the first
``train_frac`` of them form the training part and ``T_split`` is the arrival time of the
first test request. Training samples come only from training requests that *finished*
by ``T_split`` (their labels were known then); features are computed online during the
replay (:mod:`predictors.replay`), so they too only use requests finished before each
sample. The last ``calib_frac`` of training samples (by time) are held out for Platt
calibration of the classifier.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from br_serve.core.types import BoolArray, IntArray, RunningRequests
from predictors.features import FEATURE_NAMES, FeatureConfig, FeatureState
from predictors.learned import LearnedModel
from predictors.replay import Samples, TraceLike, replay, sample_grid


@dataclass(frozen=True, slots=True)
class Split:
    """Which samples train and which test (masks over a :class:`Samples`)."""

    n_train_requests: int
    split_s: float
    train: BoolArray
    test: BoolArray


def time_split(trace: TraceLike, samples: Samples, step_s: float,
               train_frac: float) -> Split:
    """The time-ordered split described in the module docstring."""
    if not 0.0 < train_frac < 1.0:
        raise ValueError(f"train_frac: must lie in (0, 1) (got {train_frac})")
    n = len(trace.arrival_s)
    n_train = min(max(int(n * train_frac), 1), n - 1)
    arr = np.asarray(trace.arrival_s, dtype=np.float64)
    split_s = float(arr[n_train])
    finish = arr + np.asarray(trace.output_tokens) * step_s
    req = samples.request
    train = (req < n_train) & (finish[req] <= split_s)
    test = req >= n_train
    return Split(n_train, split_s, train, test)


def collect_features(trace: TraceLike, samples: Samples, horizon: int, step_s: float,
                     config: FeatureConfig, seed: int = 0) -> np.ndarray:
    """Online features of every sample, ``(len(samples), F)``."""
    state = FeatureState(config, rng=np.random.default_rng(seed))
    x = np.zeros((len(samples), len(FEATURE_NAMES)), dtype=np.float64)

    def probe(running: RunningRequests, rows: IntArray) -> None:
        x[rows] = state.features(running, horizon)

    replay(trace, samples, step_s, [state], probe)
    return x


@dataclass(frozen=True, slots=True)
class FitOptions:
    hidden: int = 32
    epochs: int = 12
    batch: int = 512
    lr: float = 3e-3
    mu_weight: float = 1.0
    calib_frac: float = 0.2
    seed: int = 0


def platt(logit: np.ndarray, y: np.ndarray, iters: int = 50) -> tuple[float, float]:
    """Fit ``y ~ sigmoid(a * logit + b)`` by Newton's method (tiny ridge for stability)."""
    z = np.stack([logit, np.ones_like(logit)], axis=1)
    w = np.array([1.0, 0.0])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -40, 40)))
        grad = z.T @ (p - y) + 1e-6 * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + 1e-6 * np.eye(2)
        delta = np.linalg.solve(hess, grad)
        w -= delta
        if float(np.abs(delta).max()) < 1e-10:
            break
    return float(w[0]), float(w[1])


def fit(x: np.ndarray, remaining: IntArray, horizon: int, config: FeatureConfig,
        opts: FitOptions | None = None) -> LearnedModel:
    """Train the two heads on time-ordered samples ``x`` and calibrate the classifier.

    Raises:
        ValueError: too few samples, or only one class among them.
    """
    import torch

    o = opts or FitOptions()
    n = x.shape[0]
    y_all = (remaining <= horizon).astype(np.float64)
    n_cal = int(n * o.calib_frac)
    n_fit = n - n_cal
    if n_fit < 100 or n_cal < 20:
        raise ValueError(f"training: only {n} samples; need a longer trace part")
    if y_all[:n_fit].min() == y_all[:n_fit].max():
        raise ValueError("training: every sample has the same label; nothing to learn")
    gen = torch.Generator().manual_seed(o.seed)
    mean = x[:n_fit].mean(axis=0)
    std = x[:n_fit].std(axis=0)
    std[std < 1e-6] = 1.0
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    y = torch.tensor(y_all, dtype=torch.float32)
    r = torch.tensor(np.minimum(remaining, horizon) / max(horizon, 1), dtype=torch.float32)
    f, hd = x.shape[1], o.hidden

    def init(fan_in: int, shape: tuple[int, ...]) -> torch.Tensor:
        t: torch.Tensor = torch.randn(shape, generator=gen) * (2.0 / fan_in) ** 0.5
        return t.requires_grad_()

    params = {
        "w1": init(f, (f, hd)), "b1": torch.zeros(hd, requires_grad=True),
        "w2": init(hd, (hd, hd)), "b2": torch.zeros(hd, requires_grad=True),
        "w_cls": init(hd, (hd,)), "b_cls": torch.zeros(1, requires_grad=True),
        "w_mu": init(hd, (hd,)), "b_mu": torch.zeros(1, requires_grad=True),
    }

    def heads(xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = torch.relu(xb @ params["w1"] + params["b1"])
        h2 = torch.relu(h1 @ params["w2"] + params["b2"])
        return h2 @ params["w_cls"] + params["b_cls"], h2 @ params["w_mu"] + params["b_mu"]

    # Plain Adam written out: torch.optim imports the torch.compile stack (tens of
    # seconds on a loaded machine) for an 8-tensor model.
    plist = list(params.values())
    m1 = [torch.zeros_like(q) for q in plist]
    m2 = [torch.zeros_like(q) for q in plist]
    b1, b2, eps = 0.9, 0.999, 1e-8
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    step = 0
    for _ in range(o.epochs):
        perm = torch.randperm(n_fit, generator=gen)
        for k in range(0, n_fit, o.batch):
            idx = perm[k:k + o.batch]
            logit, mu_raw = heads(xt[idx])
            loss = bce(logit, y[idx])
            pos = y[idx] > 0.5
            if bool(pos.any()):
                loss = loss + o.mu_weight * torch.mean(
                    (torch.sigmoid(mu_raw[pos]) - r[idx][pos]) ** 2)
            grads = torch.autograd.grad(loss, plist)
            step += 1
            with torch.no_grad():
                for q, g, a1, a2 in zip(plist, grads, m1, m2, strict=True):
                    a1.mul_(b1).add_(g, alpha=1 - b1)
                    a2.mul_(b2).addcmul_(g, g, value=1 - b2)
                    denom = (a2 / (1 - b2 ** step)).sqrt_().add_(eps)
                    q.addcdiv_(a1, denom, value=-o.lr / (1 - b1 ** step))
    # Platt scaling on the held-out, later slice: p = sigmoid(a * logit + b).
    with torch.no_grad():
        logit_cal = heads(xt[n_fit:])[0].numpy().astype(np.float64)
    calib_a, calib_b = platt(logit_cal, y_all[n_fit:])
    tensors = {k: v.detach().numpy().astype(np.float64) for k, v in params.items()}
    tensors["feat_mean"] = mean
    tensors["feat_std"] = std
    info = {"n_fit": n_fit, "n_calibration": n_cal, "positive_rate": float(y_all.mean()),
            "options": dataclasses.asdict(o)}
    return LearnedModel(tensors, horizon, calib_a, calib_b, config,
                        FEATURE_NAMES, info)


def train_on_trace(trace: TraceLike, horizon: int, *, step_s: float = 0.08,
                   train_frac: float = 0.7, config: FeatureConfig | None = None,
                   opts: FitOptions | None = None) -> tuple[LearnedModel, Split]:
    """Samples -> online features -> fit on the training part only."""
    cfg = config or FeatureConfig()
    o = opts or FitOptions()
    samples = sample_grid(trace, horizon, step_s)
    split = time_split(trace, samples, step_s, train_frac)
    # Every training sample lies before T_split: replay only that far.
    early = samples.time_s <= split.split_s
    x = collect_features(trace, samples.subset(early), horizon, step_s, cfg, seed=o.seed)
    keep = split.train[early]
    model = fit(x[keep], samples.remaining[early][keep], horizon, cfg, o)
    return model, split
