"""Builder arguments are validated at the edge; errors name the field."""

from __future__ import annotations

import pytest

from br_serve.engine.factory import EngineSpec, make_engine, make_transport
from br_serve.serve.config import API_KEY_ENV, GraphConfigError, parse_graph_config


def test_defaults_match_the_issue() -> None:
    cfg = parse_graph_config()
    assert (cfg.replicas, cfg.prefill_replicas, cfg.policy, cfg.engine) == (4, 2, "br0",
                                                                            "emulated")
    assert (cfg.host, cfg.port) == ("127.0.0.1", 8000)


def test_command_line_strings_are_coerced() -> None:
    cfg = parse_graph_config({"replicas": "8", "policy": "brh", "horizon": "40",
                              "api_key": "none"})
    assert cfg.replicas == 8 and cfg.policy == "brh" and cfg.horizon == 40
    assert cfg.api_key is None


@pytest.mark.parametrize(("args", "field"), [
    ({"replicas": "0"}, "replicas"),
    ({"policy": "fastest"}, "policy"),
    ({"predictor": "crystal-ball"}, "predictor"),
    ({"engine": "tpu"}, "engine"),
    ({"transport": "carrier-pigeon"}, "transport"),
    ({"slots": "many"}, "slots"),
    ({"replica": 4}, "replica"),  # typo: unknown argument
    ({"api_key": "  "}, "api_key"),
])
def test_bad_argument_names_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(GraphConfigError) as info:
        parse_graph_config(args)
    assert str(info.value).startswith(f"{field}:")


def test_config_is_frozen() -> None:
    cfg = parse_graph_config()
    with pytest.raises(Exception):  # noqa: B017 (pydantic's frozen-instance error)
        cfg.replicas = 3


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert parse_graph_config().resolved_api_key() == "from-env"
    assert parse_graph_config(api_key="arg").resolved_api_key() == "arg"
    monkeypatch.delenv(API_KEY_ENV)
    assert parse_graph_config().resolved_api_key() is None


def test_engine_spec_and_factories() -> None:
    with pytest.raises(ValueError, match="model_path"):
        EngineSpec(kind="torch")
    eng = make_engine(parse_graph_config(kv_bytes_per_token=3).engine_spec())
    assert eng.name == "emulated" and eng.kv_bytes_per_token == 3
    assert make_transport("objref").name == "objref"
    with pytest.raises(ValueError, match="transport"):
        make_transport("smoke-signals")


def test_bad_builder_argument_fails_build() -> None:
    from br_serve.serve.graph import build

    with pytest.raises(GraphConfigError, match=r"^replicas:"):
        build({"replicas": "-1"})


def test_example_serve_config_is_valid() -> None:
    """graphs/balance_route.yaml passes Serve's schema and our builder validation."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    path = Path(__file__).resolve().parents[2] / "graphs" / "balance_route.yaml"
    doc = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(doc)
    app = schema.applications[0]
    assert app.import_path == "graphs.balance_route:build"
    cfg = parse_graph_config(app.args)
    assert cfg.replicas == 8 and cfg.host == doc["http_options"]["host"] == "127.0.0.1"
