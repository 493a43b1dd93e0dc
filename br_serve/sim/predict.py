"""Build a termination predictor by name for the simulator.

Uses ``predictors.make_predictor`` (the top-level ``predictors`` package) when it is
installed; otherwise only the core's built-ins are available (``survives``, ``oracle``).
"""

from __future__ import annotations

import importlib

import numpy as np

from br_serve.core import FinishedRequests, OracleHook, SurvivesWindow, TerminationPredictor
from br_serve.sim.config import SimConfig
from br_serve.traces import Trace


def build_predictor(config: SimConfig) -> TerminationPredictor | None:
    """The predictor ``config.predictor`` names, or None when it names none.

    Raises:
        ValueError: an unknown name (listing the known ones), or ``learned`` without
            ``predictor_model_path``.
    """
    name = config.predictor
    if name is None:
        return None
    try:
        make_predictor = importlib.import_module("predictors").make_predictor
    except (ImportError, AttributeError):
        builtin: dict[str, type[SurvivesWindow] | type[OracleHook]] = {
            "survives": SurvivesWindow, "oracle": OracleHook}
        if name not in builtin:
            raise ValueError(f"predictor: {name!r} needs the 'predictors' package, which is "
                             f"not installed; built-in: {', '.join(builtin)}") from None
        return builtin[name]()
    pred: TerminationPredictor = make_predictor(
        name, horizon=config.horizon, model_path=config.predictor_model_path,
        seed=config.seed)
    return pred


def warm_start_from(predictor: TerminationPredictor, trace: Trace) -> None:
    """Feed every request of ``trace`` to ``predictor`` as finished history."""
    n = len(trace)
    hids = trace.hash_ids
    prefix = np.asarray([hash(h) & ((1 << 62) - 1) if h else -1 for h in hids]
                        if hids is not None else np.full(n, -1), dtype=np.int64)
    predictor.observe(FinishedRequests(
        prompt_tokens=trace.input_tokens, output_tokens=trace.output_tokens,
        prefix_hash=prefix, finish_s=np.zeros(n), hash_ids=hids))
