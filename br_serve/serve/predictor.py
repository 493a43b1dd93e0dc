"""Termination predictors for BR-H in the live graph.

Uses the top-level ``predictors`` package (``make_predictor(name, horizon=...)``) when it
is installed; otherwise only ``survives`` (the closed gate) is available. The oracle
needs true output lengths and exists only in the simulator.
"""

from __future__ import annotations

from br_serve.core import SurvivesWindow, TerminationPredictor


def predictor_names() -> frozenset[str]:
    names = {"survives"}
    try:
        import predictors

        listed = getattr(predictors, "predictor_names", None)
        if callable(listed):
            names |= set(listed())
    except ImportError:
        pass
    names.discard("oracle")
    return frozenset(names)


def make_predictor(name: str, horizon: int, model_path: str | None = None,
                   seed: int = 0) -> TerminationPredictor:
    """Build predictor ``name`` (``model_path`` for ``learned``).

    Raises:
        ValueError: unknown name or bad options (from the predictors package).
    """
    if name == "survives":
        return SurvivesWindow()
    if name not in predictor_names():
        raise ValueError(f"predictor: unknown {name!r}")
    import predictors

    made: TerminationPredictor = predictors.make_predictor(name, horizon=horizon,
                                                           model_path=model_path, seed=seed)
    return made
