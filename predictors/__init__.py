"""Termination predictors for BR-H (docs/predictors.md), built by name.

``make_predictor(name, horizon=80, model_path=None, seed=0, **options)`` returns an
object satisfying ``br_serve.core.predictor.TerminationPredictor``:

- ``survives``: the core's closed gate (every request survives the window).
- ``survival``: empirical output-length survival, learned online (``predictors.survival``).
- ``exact``: prefix-keyed ExactMatch with a survival fallback (``predictors.exact``).
- ``oracle``: true remaining steps; simulator only (``predictors.oracle``).
- ``learned``: a small two-head torch model loaded from ``model_path``
  (``predictors.learned``; train one with ``br-serve train-predictor``).

Options are validated (pydantic); an unknown option or bad value raises ``ValueError``
naming it. Online learning: call ``predictor.observe(FinishedRequests(...))`` as requests
finish; :func:`warm_start` feeds a history of finished requests in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from br_serve.config.errors import validated
from br_serve.core.predictor import FinishedRequests, SurvivesWindow, TerminationPredictor
from br_serve.core.registry import Registry

M = TypeVar("M", bound=BaseModel)

#: ``factory(horizon, model_path, rng, options) -> predictor``; options still loose.
PredictorFactory = Callable[[int, str | None, np.random.Generator, Mapping[str, Any]],
                            TerminationPredictor]

#: The predictor family. Built-ins are registered below (their modules load lazily, so
#: importing this package stays cheap); a qualified ``package.module.factory`` works too.
PREDICTORS: Registry[PredictorFactory] = Registry("predictor")


def predictor_names() -> tuple[str, ...]:
    """Names :func:`make_predictor` accepts (qualified names aside)."""
    return tuple(sorted(PREDICTORS.names()))


def parse_options(model: type[M], options: Mapping[str, Any], owner: str) -> M:
    """Validate ``options`` into ``model``; ``ValueError("<owner>.<field>: ...")`` if bad."""
    return validated(model, options, ValueError, owner)


def make_predictor(name: str, *, horizon: int = 80, model_path: str | None = None,
                   seed: int = 0, **options: Any) -> TerminationPredictor:
    """Build the predictor ``name`` (see the module docstring).

    ``seed`` seeds the injected RNG (reservoir memory). ``horizon`` is checked against
    the horizon a ``learned`` model was trained for.

    Raises:
        ValueError: unknown name (listing the known ones), bad option, ``learned``
            without ``model_path``, or a corrupted model file.
        FileNotFoundError: ``model_path`` does not exist.
    """
    if horizon < 0:
        raise ValueError(f"horizon: must be >= 0 (got {horizon})")
    factory = PREDICTORS.get(name)
    return factory(horizon, model_path, np.random.default_rng(seed), options)


def _no_options(name: str, options: Mapping[str, Any]) -> None:
    if options:
        raise ValueError(f"{name}: takes no options (got {', '.join(sorted(options))})")


@PREDICTORS.register("survives")
def _survives(horizon: int, model_path: str | None, rng: np.random.Generator,
              options: Mapping[str, Any]) -> TerminationPredictor:
    _no_options("survives", options)
    return SurvivesWindow()


@PREDICTORS.register("oracle")
def _oracle(horizon: int, model_path: str | None, rng: np.random.Generator,
            options: Mapping[str, Any]) -> TerminationPredictor:
    _no_options("oracle", options)
    from predictors.oracle import OraclePredictor

    return OraclePredictor()


@PREDICTORS.register("survival")
def _survival(horizon: int, model_path: str | None, rng: np.random.Generator,
              options: Mapping[str, Any]) -> TerminationPredictor:
    from predictors.survival import SurvivalConfig, SurvivalPredictor

    return SurvivalPredictor(parse_options(SurvivalConfig, options, "survival"), rng=rng)


@PREDICTORS.register("exact")
def _exact(horizon: int, model_path: str | None, rng: np.random.Generator,
           options: Mapping[str, Any]) -> TerminationPredictor:
    from predictors.exact import ExactConfig, ExactMatchPredictor

    return ExactMatchPredictor(parse_options(ExactConfig, options, "exact"), rng=rng)


@PREDICTORS.register("learned")
def _learned(horizon: int, model_path: str | None, rng: np.random.Generator,
             options: Mapping[str, Any]) -> TerminationPredictor:
    _no_options("learned", options)
    if not model_path:
        raise ValueError("learned: needs model_path (a file written by "
                         "`br-serve train-predictor --out FILE`)")
    from predictors.learned import LearnedPredictor

    return LearnedPredictor.load(model_path, horizon=horizon, rng=rng)


def finished_requests(prompt_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike, *,
                      hash_ids: Sequence[tuple[int, ...] | None] | None = None,
                      prefix_hash: npt.ArrayLike | None = None,
                      finish_s: npt.ArrayLike | None = None) -> FinishedRequests:
    """Build a :class:`FinishedRequests` from plain arrays (missing fields: unknown).

    Raises:
        ValueError: arrays of different lengths.
    """
    pt = np.asarray(prompt_tokens, dtype=np.int64)
    out = np.asarray(output_tokens, dtype=np.int64)
    n = pt.shape[0]
    ph = np.full(n, -1, np.int64) if prefix_hash is None else np.asarray(prefix_hash, np.int64)
    fs = np.zeros(n) if finish_s is None else np.asarray(finish_s, np.float64)
    for field, arr in (("output_tokens", out), ("prefix_hash", ph), ("finish_s", fs)):
        if arr.shape != (n,):
            raise ValueError(f"{field}: shape {arr.shape}, expected ({n},)")
    hid = None if hash_ids is None else tuple(hash_ids)
    if hid is not None and len(hid) != n:
        raise ValueError(f"hash_ids: {len(hid)} rows, expected {n}")
    return FinishedRequests(prompt_tokens=pt, output_tokens=out, prefix_hash=ph,
                            finish_s=fs, hash_ids=hid)


def warm_start(predictor: TerminationPredictor, prompt_tokens: npt.ArrayLike,
               output_tokens: npt.ArrayLike, *,
               hash_ids: Sequence[tuple[int, ...] | None] | None = None,
               prefix_hash: npt.ArrayLike | None = None) -> None:
    """Feed a history of finished requests (e.g. an earlier trace) to ``predictor``."""
    predictor.observe(finished_requests(prompt_tokens, output_tokens, hash_ids=hash_ids,
                                        prefix_hash=prefix_hash))


__all__ = ["PREDICTORS", "finished_requests", "make_predictor", "parse_options",
           "predictor_names", "warm_start"]
