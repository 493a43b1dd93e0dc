"""Builder arguments are validated at the edge; errors name the field."""

from __future__ import annotations

import pytest

from br_serve.engine.factory import EngineSpec, make_engine
from br_serve.serve.config import API_KEY_ENV, GraphConfigError, parse_graph_config
from br_serve.transport.factory import make_transport


def test_defaults_match_the_issue() -> None:
    cfg = parse_graph_config()
    assert (cfg.replicas, cfg.prefill_replicas, cfg.policy, cfg.engine) == (4, 2, "br0",
                                                                            "emulated")
    assert (cfg.host, cfg.port) == ("127.0.0.1", 8000)


def test_command_line_strings_are_coerced() -> None:
    cfg = parse_graph_config({"replicas": "8", "policy": "brh",
                              "policy_options": '{"horizon": "40"}', "api_key": "none",
                              "predictor": "survival"})
    assert cfg.replicas == 8 and cfg.policy == "brh" and cfg.policy_options["horizon"] == 40
    assert cfg.predictor_horizon() == 40 and cfg.predictor == "survival"
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
    ({"policy_options": {"r_max": 0}}, "policy_options.r_max"),
    ({"policy": "jsq", "policy_options": '{"horizon": 3}'}, "policy_options.horizon"),
    ({"policy_options": "{not json"}, "policy_options"),
    ({"policy": "br0", "predictor": "survival"}, "predictor"),  # br0 uses no predictor
    ({"policy": "brh", "predictor": "oracle"}, "predictor"),  # the simulator's only
    ({"step_b_s": "0.1,0.2"}, "step_b_s"),  # 2 values for 4 replicas
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
        EngineSpec(engine="torch")
    from br_serve.engine.emulated import EmulatedEngine

    cfg = parse_graph_config(kv_bytes_per_token=3, step_b_s="0.1,0.2,0.3,0.4")
    eng = make_engine(cfg, cfg.engine_timing(2))
    assert isinstance(eng, EmulatedEngine)
    assert eng.kv_bytes_per_token == 3 and eng.step_b_s == 0.3
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


def test_mooncake_master_is_validated_and_optional() -> None:
    assert parse_graph_config().mooncake_master is None
    assert parse_graph_config(mooncake_master="none").mooncake_master is None
    cfg = parse_graph_config({"transport": "mooncake", "mooncake_master": "10.0.0.5:50051"})
    assert cfg.mooncake_master == "10.0.0.5:50051"
    for bad in ("10.0.0.5", ":50051", "host:0", "host:65536", "host:port"):
        with pytest.raises(GraphConfigError, match=r"^mooncake_master: expected host:port"):
            parse_graph_config(mooncake_master=bad)


def test_make_transport_passes_the_master_address(monkeypatch: pytest.MonkeyPatch) -> None:
    import br_serve.transport.mooncake as mc

    seen: list[str | None] = []

    class Recorder:
        name = "mooncake"

        def __init__(self, master_address: str | None = None) -> None:
            seen.append(master_address)

    monkeypatch.setattr(mc, "MooncakeTransport", Recorder)
    make_transport("mooncake", "10.0.0.5:50051")
    make_transport("mooncake")
    make_transport("objref", "10.0.0.5:50051")  # ignored: no Mooncake client built
    assert seen == ["10.0.0.5:50051", None]


@pytest.mark.parametrize(("device", "extra"), [
    ("cpu", {}),
    ("npu", {"resources": {"NPU": 1.0}}),
    ("npu:1", {"resources": {"NPU": 1.0}}),
    ("cuda", {"num_gpus": 1.0}),
])
def test_replicas_request_their_accelerator(device: str, extra: dict[str, object]) -> None:
    """The options both the prefill deployment and the decode actors are built with."""
    from br_serve.serve.graph import build

    cfg = parse_graph_config(device=device)
    assert cfg.replica_actor_options() == {"num_cpus": 0, **extra}
    # the bound app: Ingress(prefill, config); Serve keeps the options it will use
    prefill = build(cfg)._bound_deployment.init_args[0]._bound_deployment
    assert prefill.name == "Prefill"
    assert prefill.ray_actor_options == {"num_cpus": 0, **extra}


def test_unknown_device_names_the_field() -> None:
    with pytest.raises(GraphConfigError, match=r"^device: .*unknown 'tpu'"):
        parse_graph_config(device="tpu")


def test_pick_app_finds_the_one_graph_or_says_why() -> None:
    from br_serve.serve.graph import pick_app

    graph = ["Ingress", "Prefill"]
    assert pick_app({"default": graph, "other": ["Api"]}) == "default"
    with pytest.raises(LookupError, match=r"several .*\['a', 'b'\]"):
        pick_app({"a": graph, "b": graph})
    with pytest.raises(LookupError, match=r"no BalanceRoute application .*\['other'\]"):
        pick_app({"other": ["Api"]})
    with pytest.raises(LookupError, match="none"):
        pick_app({})
