"""cluster.yaml passes Ray's own cluster-config preparation and schema validation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster.yaml"


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    data = yaml.safe_load(CLUSTER_YAML.read_text())
    assert isinstance(data, dict)
    return data


def _validate(config: dict[str, Any]) -> dict[str, Any]:
    # What `ray up` does before it touches any host: fill defaults for the provider
    # (local: one node type from head_ip/worker_ips), then JSON-schema validation.
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_cluster_yaml_is_valid_for_ray_up(config: dict[str, Any]) -> None:
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "local"
    assert len(prepared["provider"]["worker_ips"]) == config["max_workers"]
    node_type = prepared["available_node_types"][prepared["head_node_type"]]
    assert node_type["max_workers"] == len(config["provider"]["worker_ips"])


def test_cluster_yaml_bootstraps_like_ray_up(config: dict[str, Any], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.autoscaler._private.commands import _bootstrap_config

    monkeypatch.chdir(tmp_path)  # the local provider may write state next to cwd/tmp
    resolved = _bootstrap_config(copy.deepcopy(config), no_config_cache=True)
    assert resolved["provider"]["head_ip"] == config["provider"]["head_ip"]


def test_npu_resources_and_ascend_setup(config: dict[str, Any]) -> None:
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    for cmds in (head, worker):
        assert "--resources='{\"NPU\": 8}'" in cmds
        assert "ascend-toolkit/set_env.sh" in cmds
        assert "MOONCAKE_MASTER=" in cmds
    assert "mooncake_master --rpc_port=50051" in head
    setup = " ".join(config["setup_commands"])
    for needle in ("torch-npu", "mooncake-transfer-engine-npu", "balanceroute[torch]",
                   "ascend-toolkit/set_env.sh"):
        assert needle in setup


def test_validation_rejects_a_broken_config(config: dict[str, Any]) -> None:
    from jsonschema.exceptions import ValidationError

    broken = copy.deepcopy(config)
    broken["head_start_ray_commands"] = "ray start --head"  # must be a list
    with pytest.raises(ValidationError):
        _validate(broken)
    broken = copy.deepcopy(config)
    broken["not_a_ray_field"] = 1
    with pytest.raises(ValidationError):
        _validate(broken)
