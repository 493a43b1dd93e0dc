"""Build a termination predictor by name for the simulator.

Uses ``predictors.make_predictor`` (the top-level ``predictors`` package) when it is
installed; otherwise only the core's built-ins are available (``survives``, ``oracle``).
"""

from __future__ import annotations

import importlib

from br_serve.core import OracleHook, SurvivesWindow, TerminationPredictor
from br_serve.sim.config import SimConfig


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
