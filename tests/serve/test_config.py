"""Builder arguments are validated at the edge; errors name the field."""

from __future__ import annotations

import pytest

from br_serve.engine.factory import EngineConfig, make_engine
from br_serve.serve.config import API_KEY_ENV, GraphConfigError, parse_graph_config
from br_serve.transport.factory import make_transport


def test_defaults_match_the_issue() -> None:
    cfg = parse_graph_config()
    assert (cfg.replicas, cfg.prefill.replicas, cfg.policy.name, cfg.engine.name) == (
        4, 2, "br0", "emulated")
    assert (cfg.serve.host, cfg.serve.port) == ("127.0.0.1", 8000)


def test_command_line_strings_are_coerced() -> None:
    cfg = parse_graph_config({"replicas": "8", "policy": "brh",
                              "policy_options": '{"horizon": "40"}', "serve_api_key": "none",
                              "predictor": "survival"})
    assert cfg.replicas == 8 and cfg.policy.name == "brh"
    assert cfg.policy.options["horizon"] == 40
    assert cfg.predictor_horizon() == 40 and cfg.predictor.name == "survival"
    assert cfg.serve.api_key is None


def test_every_spelling_of_a_path_is_the_same_field() -> None:
    """Dotted, flat (``_``) and nested spellings land in the same field; a bare name
    sets a section's ``name``; keys below ``policy.options`` address one option."""
    dotted = parse_graph_config({"step.b_s": "0.01", "policy.name": "brh",
                                 "policy.options.horizon": "40", "serve.port": "9000",
                                 "predictor.name": "survival"})
    flat = parse_graph_config({"step_b_s": "0.01", "policy": "brh",
                               "policy_options": {"horizon": 40}, "serve_port": 9000,
                               "predictor": "survival"})
    nested = parse_graph_config({"step": {"b_s": 0.01}, "serve": {"port": 9000},
                                 "policy": {"name": "brh", "options": {"horizon": 40}},
                                 "predictor": {"name": "survival"}})
    assert dotted == flat == nested
    assert dotted.step.b_s == 0.01 and dotted.serve.port == 9000


def test_flat_names_are_one_to_one() -> None:
    """No two fields share a flat spelling (``step_b_s`` names exactly ``step.b_s``)."""
    from br_serve.config.tree import check_flat_names, leaves
    from br_serve.serve.config import GraphConfig
    from br_serve.sim.config import SimConfig

    check_flat_names(GraphConfig)
    check_flat_names(SimConfig)
    names = {leaf.name for leaf in leaves(GraphConfig)}
    assert {"step.a_s_per_token", "prefill.p0_s", "pool.capacity", "pool.ttl_s",
            "policy.options", "predictor.model_path", "engine.slowdown",
            "engine.step_factor", "remote.api_key", "transport.mooncake_master",
            "serve.max_context_tokens", "kv_limit_tokens"} <= names


def test_overrides_replace_a_field_and_merge_a_section() -> None:
    base = parse_graph_config(policy="br0", policy_options={"r_max": 4}, serve_port=9000)
    assert parse_graph_config(base, policy="brh").policy.options == {"r_max": 4}
    assert parse_graph_config(base, policy_options={}).policy.options == {}
    more = parse_graph_config(base, **{"policy.options.cost": "time"})
    assert more.policy.options == {"r_max": 4, "cost": "time"}
    assert parse_graph_config(base, serve={"host": "0.0.0.0"}).serve.port == 9000


@pytest.mark.parametrize(("args", "field"), [
    ({"replicas": "0"}, "replicas"),
    ({"policy": "fastest"}, "policy.name"),
    ({"predictor": "crystal-ball"}, "predictor.name"),
    ({"engine": "tpu"}, "engine.name"),
    ({"transport": "carrier-pigeon"}, "transport.name"),
    ({"slots": "many"}, "slots"),
    ({"replica": 4}, "replica"),  # typo: unknown argument
    ({"step_z_s": 4}, "step_z_s"),  # not a field of the step section
    ({"serve.api_key": "  "}, "serve.api_key"),
    ({"policy_options": {"r_max": 0}}, "policy.options.r_max"),
    ({"policy.options.r_max": "x"}, "policy.options.r_max"),
    ({"policy": "jsq", "policy_options": '{"horizon": 3}'}, "policy.options.horizon"),
    ({"policy_options": "{not json"}, "policy.options"),
    ({"policy": "br0", "predictor": "survival"}, "predictor.name"),  # br0 uses none
    ({"policy": "brh", "predictor": "oracle"}, "predictor.name"),  # the simulator's only
    ({"policy": "brh", "predictor": "survival", "predictor.options.max_samples": 0},
     "predictor.options.max_samples"),
    ({"policy": "brh", "predictor": "learned"}, "predictor.model_path"),
    ({"policy": "brh", "predictor": "survival", "predictor.model_path": "m.st"},
     "predictor.model_path"),  # survival reads no model file
    ({"step_b_s": "0.1,0.2"}, "step.b_s"),  # 2 values for 4 replicas
    ({"step.b_s": "-1"}, "step.b_s"),
    ({"engine.step_factor": "1,2"}, "engine.step_factor"),
    ({"kv_limit_tokens": 0}, "kv_limit_tokens"),
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
    assert parse_graph_config(serve_api_key="arg").resolved_api_key() == "arg"
    monkeypatch.delenv(API_KEY_ENV)
    assert parse_graph_config().resolved_api_key() is None


def test_engine_config_and_factories() -> None:
    with pytest.raises(ValueError, match="model_path"):
        EngineConfig(name="torch")
    from br_serve.engine.emulated import EmulatedEngine

    cfg = parse_graph_config(engine_kv_bytes_per_token=3, step_b_s="0.1,0.2,0.3,0.4")
    eng = make_engine(cfg.engine, cfg.engine_timing(2))
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
    assert cfg.replicas == 8 and cfg.serve.host == doc["http_options"]["host"] == "127.0.0.1"
    assert (cfg.policy.name, cfg.prefill.replicas, cfg.pool.capacity) == ("br0", 2, 1024)
    assert (cfg.engine.name, cfg.transport.name) == ("emulated", "objref")


def test_mooncake_master_is_validated_and_optional() -> None:
    assert parse_graph_config().transport.mooncake_master is None
    none = parse_graph_config(transport_mooncake_master="none")
    assert none.transport.mooncake_master is None
    cfg = parse_graph_config({"transport": "mooncake",
                              "transport.mooncake_master": "10.0.0.5:50051"})
    assert cfg.transport.mooncake_master == "10.0.0.5:50051"
    for bad in ("10.0.0.5", ":50051", "host:0", "host:65536", "host:port"):
        with pytest.raises(GraphConfigError,
                           match=r"^transport.mooncake_master: expected host:port"):
            parse_graph_config(transport_mooncake_master=bad)


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

    cfg = parse_graph_config(engine_device=device)
    assert cfg.replica_actor_options() == {"num_cpus": 0, **extra}
    # the bound app: Ingress(prefill, config); Serve keeps the options it will use
    prefill = build(cfg)._bound_deployment.init_args[0]._bound_deployment
    assert prefill.name == "Prefill"
    assert prefill.ray_actor_options == {"num_cpus": 0, **extra}


def test_unknown_device_names_the_field() -> None:
    with pytest.raises(GraphConfigError, match=r"^engine.device: .*unknown 'tpu'"):
        parse_graph_config(engine_device="tpu")


def test_pick_app_finds_the_one_graph_or_says_why() -> None:
    from br_serve.serve.graph import pick_app

    graph = ["Actors", "Ingress", "Prefill"]
    assert pick_app({"default": graph, "other": ["Api"]}) == "default"
    with pytest.raises(LookupError, match=r"several .*\['a', 'b'\]"):
        pick_app({"a": graph, "b": graph})
    with pytest.raises(LookupError, match=r"no BalanceRoute application .*\['other'\]"):
        pick_app({"other": ["Api"]})
    with pytest.raises(LookupError, match="none"):
        pick_app({})


def test_kv_limit_bounds_the_graph_as_the_simulator() -> None:
    """``kv_limit_tokens`` is one concept for both: the scheduler's mirror (what the
    policies admit against) and the context bound a request is refused beyond."""
    from br_serve.core import build_policy
    from br_serve.core.step import StepModel
    from br_serve.serve.prefill.worker import over_context
    from br_serve.serve.scheduler.core import SchedulerCore

    cfg = parse_graph_config(kv_limit_tokens=4096)
    assert cfg.context_limit_tokens() == 4096
    assert parse_graph_config().context_limit_tokens() == cfg.serve.max_context_tokens
    refused = over_context("r", 4000, 200, cfg.context_limit_tokens())
    assert refused is not None and refused.error_status == 400
    core = SchedulerCore(2, 4, 8, StepModel(), build_policy("jsq"), detail=False,
                         kv_limit_tokens=cfg.kv_limit_tokens)
    assert core.mirror.state.kv_limit.tolist() == [4096, 4096]
