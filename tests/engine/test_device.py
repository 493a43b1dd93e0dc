"""Device names, backends, Ray resources, and the torch autoload environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from br_serve.engine.device import (
    DeviceError,
    collective_backend,
    npu_package_installed,
    parse_device,
    ray_actor_options_for,
    ray_resources_for,
    resolve_device,
)


def test_parse_and_mappings() -> None:
    assert parse_device("cuda:1") == ("cuda", 1)
    assert parse_device("NPU") == ("npu", None)
    assert parse_device("cpu") == ("cpu", None)
    for bad in ("gpu", "cuda:x", "cpu:3", ""):
        with pytest.raises(DeviceError):
            parse_device(bad)
    assert [collective_backend(d) for d in ("cpu", "cuda:0", "npu:3")] == ["gloo", "nccl",
                                                                        "hccl"]
    assert ray_resources_for("npu") == {"NPU": 1.0}
    assert ray_resources_for("cuda:1") == {"GPU": 1.0}
    assert ray_resources_for("cpu") == {}
    assert ray_actor_options_for("npu") == {"resources": {"NPU": 1.0}}
    assert ray_actor_options_for("cuda") == {"num_gpus": 1.0}


def test_resolve_present_and_absent() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="not present"):
            resolve_device("cuda")
    else:
        with pytest.raises(DeviceError, match="only"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    if not npu_package_installed():
        with pytest.raises(DeviceError, match="torch_npu is not installed"):
            resolve_device("npu:0")


def test_autoload_disabled_without_torch_npu() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    code = ("import os, sys, br_serve.engine.device; "
            "print(os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[1] == "False"  # importing the device module does not import torch
    assert out[0] == ("None" if npu_package_installed() else "0")
