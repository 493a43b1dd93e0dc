"""The configuration tree: one name per field, its reference page, the CLI flags derived
from it, and validation that builds nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from br_serve.config.reference import page
from br_serve.config.tree import leaves
from br_serve.serve.config import GraphConfig
from br_serve.sim.config import SimConfig, parse_sim_config


def test_the_reference_page_is_generated_from_the_tree() -> None:
    path = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert path.read_text() == page(), "run: br-serve config-reference > docs/configuration.md"


def test_every_field_has_a_docstring() -> None:
    for model in (GraphConfig, SimConfig):
        missing = [leaf.name for leaf in leaves(model) if not leaf.doc]
        assert not missing, missing


def test_sim_flags_are_the_paths() -> None:
    """Every SimConfig field but the sweep dimensions is a flag named by its path."""
    import argparse

    from br_serve.sim.cli import add_cluster_args

    p = argparse.ArgumentParser()
    add_cluster_args(p)
    flags = {a for act in p._actions for a in act.option_strings}
    want = {leaf.flag for leaf in leaves(SimConfig)
            if leaf.name not in ("replicas", "policy.name", "policy.options", "predictor.name")}
    assert want <= flags
    assert {"--step-b-s", "--kv-limit-tokens", "--prefill-p1-s-per-token",
            "--predictor-model-path", "--sim-saturated"} <= flags
    for old in ("--step-b", "--kv-limit", "--prefill-p1-s", "--predictor-model", "--horizon",
                "--saturated"):
        assert old not in flags


def test_validation_builds_no_predictor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing a config that names a predictor validates its name and options against
    its declared options class and builds nothing; the process that runs the policy
    builds it once."""
    import predictors

    built: list[str] = []
    kind = predictors.predictor_kind("survival")

    def spy(opts: Any, horizon: int, path: str | None, rng: Any) -> Any:
        built.append("survival")
        return kind.build(opts, horizon, path, rng)

    monkeypatch.setitem(predictors.PREDICTORS._items, "survival",
                        predictors.PredictorKind(spy, kind.Options))
    cfg = GraphConfig(policy="brh", predictor={"name": "survival",  # type: ignore[arg-type]
                                               "options": {"min_samples": 2}})
    sim = SimConfig.model_validate(cfg.model_dump(include={"replicas", "policy", "predictor"}))
    assert built == []
    pred = sim.build_predictor()
    assert built == ["survival"] and pred is not None
    assert pred.config.min_samples == 2  # type: ignore[attr-defined]


def test_the_horizon_comes_from_the_policy() -> None:
    """One default window: BR-H's ``horizon`` option; ``make_predictor`` has none."""
    import inspect

    from predictors import make_predictor

    assert inspect.signature(make_predictor).parameters["horizon"].default is \
        inspect.Parameter.empty
    cfg = SimConfig(policy="brh", predictor="survival")  # type: ignore[arg-type]
    assert cfg.predictor_horizon() == 800
    assert SimConfig(policy="brh",  # type: ignore[arg-type]
                     policy_options={"horizon": 40}).predictor_horizon() == 40  # type: ignore[call-arg]


def test_a_model_file_is_read_once_per_process(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import predictors.learned as learned

    reads: list[str] = []
    real = learned.LearnedModel.load

    def counting(path: str | Path) -> learned.LearnedModel:
        reads.append(str(path))
        return real(path)

    model = _tiny_model(tmp_path)
    monkeypatch.setattr(learned.LearnedModel, "load", staticmethod(counting))
    cfg = parse_sim_config(policy="brh", policy_options={"horizon": 8},
                           predictor={"name": "learned", "model_path": str(model)})
    assert reads == []  # validation reads nothing
    a, b = cfg.build_predictor(), cfg.build_predictor()
    assert a is not b and len(reads) == 1


def _tiny_model(tmp_path: Path) -> Path:
    from br_serve.traces import Trace
    from predictors.train import FitOptions, train_on_trace

    n = 400
    trace = Trace.build([i * 0.5 for i in range(n)], [50 + i % 7 for i in range(n)],
                        [5 + (i * 13) % 40 for i in range(n)],
                        tuple((i % 5, i) for i in range(n)))
    model, _ = train_on_trace(trace, 8, step_s=0.05, train_frac=0.7,
                              opts=FitOptions(hidden=4, epochs=1, seed=0))
    path = tmp_path / "m.safetensors"
    model.save(path)
    return path
