"""Termination predictors for BR-H (docs/predictors.md), registered by name.

A predictor is a :class:`PredictorKind` in :data:`PREDICTORS`: its options, declared as a
frozen :class:`~br_serve.core.options.Options` dataclass like a policy's, and how to
build it. A configuration validates a predictor's name and options against the kind
(:func:`predictor_kind`, :func:`parse_predictor_options`) without building it; the one
process that uses it builds it with :func:`make_predictor`:

- ``survives``: the core's closed gate (every request survives the window).
- ``survival``: empirical output-length survival, learned online (``predictors.survival``).
- ``exact``: prefix-keyed ExactMatch with a survival fallback (``predictors.exact``).
- ``oracle``: true remaining steps; simulator only (``predictors.oracle``).
- ``learned``: a small two-head model loaded from ``model_path`` (``predictors.learned``;
  train one with ``br-serve train-predictor``); a file is read once per process.

The window ``horizon`` always comes from the policy that asks (BR-H's ``horizon``
option). Online learning: call ``predictor.observe(FinishedRequests(...))`` as requests
finish; :func:`warm_start` feeds a history of finished requests in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from br_serve.core.options import ConfigError, NoOptions, Options, parse_options
from br_serve.core.predictor import FinishedRequests, SurvivesWindow, TerminationPredictor
from br_serve.core.registry import Registry
from predictors.exact import ExactOptions
from predictors.survival import SurvivalOptions

#: ``build(options, horizon, model_path, rng) -> predictor``; options already validated.
PredictorBuild = Callable[[Any, int, "str | None", np.random.Generator], TerminationPredictor]


@dataclass(frozen=True, slots=True)
class PredictorKind:
    """A registered predictor: its options class, its builder and what it needs.

    ``model_file``: it reads a model file (``predictor.model_path`` is required, and
    refused for every other kind). ``simulator_only``: it reads true output lengths,
    which only the simulator knows.
    """

    build: PredictorBuild
    Options: type[Options] = NoOptions
    model_file: bool = False
    simulator_only: bool = False


#: The predictor family; a qualified ``package.module.NAME`` naming a
#: :class:`PredictorKind` works too.
PREDICTORS: Registry[PredictorKind] = Registry("predictor")


def predictor_names() -> tuple[str, ...]:
    """Names :func:`make_predictor` accepts (qualified names aside)."""
    return tuple(sorted(PREDICTORS.names()))


def predictor_kind(name: str) -> PredictorKind:
    """The kind registered as ``name``.

    Raises:
        ConfigError: unknown name (listing the known ones), or a qualified name that is
            not a :class:`PredictorKind`.
    """
    kind = PREDICTORS.get(name)
    if not isinstance(kind, PredictorKind):
        raise ConfigError(f"predictor: {name!r} is not a PredictorKind")
    return kind


def parse_predictor_options(name: str, options: Mapping[str, Any] | Options | None = None
                            ) -> Options:
    """Validate ``options`` for predictor ``name`` (no predictor is built).

    Raises:
        ConfigError: unknown predictor, unknown option or bad value, named.
    """
    return parse_options(predictor_kind(name).Options, options)


def make_predictor(name: str, *, horizon: int, model_path: str | None = None,
                   seed: int = 0, **options: Any) -> TerminationPredictor:
    """Build the predictor ``name`` for the window ``horizon`` of the policy that asks.

    ``seed`` seeds the injected RNG (reservoir memory). ``horizon`` is checked against
    the horizon a ``learned`` model was trained for.

    Raises:
        ValueError: unknown name (listing the known ones), bad option, ``learned``
            without ``model_path``, or a corrupted model file.
        FileNotFoundError: ``model_path`` does not exist.
    """
    if horizon < 0:
        raise ValueError(f"horizon: must be >= 0 (got {horizon})")
    kind = predictor_kind(name)
    opts = parse_options(kind.Options, options, owner=name)
    if kind.model_file and not model_path:
        raise ValueError(f"{name}: needs model_path (a file written by "
                         "`br-serve train-predictor --out FILE`)")
    return kind.build(opts, horizon, model_path, np.random.default_rng(seed))


def _survives(opts: Any, horizon: int, model_path: str | None,
              rng: np.random.Generator) -> TerminationPredictor:
    return SurvivesWindow()


def _oracle(opts: Any, horizon: int, model_path: str | None,
            rng: np.random.Generator) -> TerminationPredictor:
    from predictors.oracle import OraclePredictor

    return OraclePredictor()


def _survival(opts: Any, horizon: int, model_path: str | None,
              rng: np.random.Generator) -> TerminationPredictor:
    from predictors.survival import SurvivalPredictor

    return SurvivalPredictor(opts, rng=rng)


def _exact(opts: Any, horizon: int, model_path: str | None,
           rng: np.random.Generator) -> TerminationPredictor:
    from predictors.exact import ExactMatchPredictor

    return ExactMatchPredictor(opts, rng=rng)


def _learned(opts: Any, horizon: int, model_path: str | None,
             rng: np.random.Generator) -> TerminationPredictor:
    from predictors.learned import LearnedPredictor

    assert model_path is not None  # checked by make_predictor
    return LearnedPredictor.load(model_path, horizon=horizon, rng=rng)


PREDICTORS.register("survives")(PredictorKind(_survives))
PREDICTORS.register("oracle")(PredictorKind(_oracle, simulator_only=True))
PREDICTORS.register("survival")(PredictorKind(_survival, SurvivalOptions))
PREDICTORS.register("exact")(PredictorKind(_exact, ExactOptions))
PREDICTORS.register("learned")(PredictorKind(_learned, model_file=True))


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


__all__ = ["PREDICTORS", "PredictorKind", "finished_requests", "make_predictor",
           "parse_predictor_options", "predictor_kind", "predictor_names", "warm_start"]
