"""Device selection for the torch engine: ``cpu``, ``cuda[:N]`` or ``npu[:N]`` (Ascend).

Contracts:
- Importing this module never imports torch. It sets ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
  when ``torch_npu`` is not installed, so that a later ``import torch`` does not scan for
  out-of-tree backends; where ``torch_npu`` is installed the variable is left alone
  (torch then loads it as its ``npu`` backend). Import this module before torch.
- :func:`resolve_device` returns a usable ``torch.device`` or raises :class:`DeviceError`
  (a ``ValueError``) naming the device and why it is unusable; it never hangs.
- :func:`collective_backend` and :func:`ray_resources_for` are pure name mappings.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

_DEVICE_RE = re.compile(r"^(cpu|cuda|npu)(?::(\d+))?$")


class DeviceError(ValueError):
    """The requested device does not exist or cannot be used on this host."""


def npu_package_installed() -> bool:
    """Whether ``torch_npu`` is importable (installed), without importing it."""
    return importlib.util.find_spec("torch_npu") is not None


def prepare_torch_env() -> None:
    """Set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` where torch_npu is absent (idempotent).

    Must run before the first ``import torch`` of the process to have an effect; an
    explicit user setting is kept.
    """
    if not npu_package_installed():
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


prepare_torch_env()


def parse_device(name: str) -> tuple[str, int | None]:
    """Split ``"cuda:1"`` into ``("cuda", 1)``; ``"cpu"`` into ``("cpu", None)``.

    Raises:
        DeviceError: not one of ``cpu``, ``cuda[:N]``, ``npu[:N]``.
    """
    m = _DEVICE_RE.match(name.strip().lower()) if isinstance(name, str) else None
    if m is None:
        raise DeviceError(f"device: unknown {name!r}; expected cpu, cuda[:N] or npu[:N]")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu" and index is not None and index != "0":
        raise DeviceError(f"device: {name!r}: cpu takes no index")
    return kind, (int(index) if index is not None and kind != "cpu" else None)


def _import_torch_npu() -> Any:
    if not npu_package_installed():
        raise DeviceError(
            "device 'npu' is not present: torch_npu is not installed "
            "(install the torch-npu wheel matching your torch and CANN versions)")
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # missing CANN libraries, version mismatch, ...
        raise DeviceError(
            f"device 'npu' is not usable: importing torch_npu failed: {exc} "
            "(did you source /usr/local/Ascend/ascend-toolkit/set_env.sh?)") from exc
    import torch

    return torch.npu  # type: ignore[attr-defined]


def resolve_device(name: str) -> Any:
    """The ``torch.device`` for ``name``, checked to exist on this host.

    Raises:
        DeviceError: unknown name, backend not built / not installed, no device, or an
            index beyond the number of visible devices.
    """
    kind, index = parse_device(name)
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device {name!r} is not present: torch.cuda.is_available() is False "
                f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
        count = torch.cuda.device_count()
    else:
        npu = _import_torch_npu()
        if not npu.is_available():
            raise DeviceError(f"device {name!r} is not present: torch.npu.is_available() "
                              "is False (check ASCEND_RT_VISIBLE_DEVICES and npu-smi info)")
        count = npu.device_count()
    idx = 0 if index is None else index
    if idx >= count:
        raise DeviceError(f"device {name!r} is not present: only {count} {kind} device(s) "
                          "are visible to this process")
    return torch.device(kind, idx)


def collective_backend(device: str) -> str:
    """The torch.distributed backend for the step barrier: gloo / nccl / hccl."""
    kind, _ = parse_device(device)
    return {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[kind]


def ray_resources_for(device: str) -> dict[str, float]:
    """Extra Ray resources one replica on ``device`` must request.

    ``{"GPU": 1}`` for cuda (Ray then sets ``CUDA_VISIBLE_DEVICES``), ``{"NPU": 1}`` for
    npu (Ray sets ``ASCEND_RT_VISIBLE_DEVICES``), nothing for cpu. Pass ``"GPU"`` as
    ``num_gpus`` and the rest as ``resources`` in Ray options.
    """
    kind, _ = parse_device(device)
    return {"cpu": {}, "cuda": {"GPU": 1.0}, "npu": {"NPU": 1.0}}[kind]


def ray_actor_options_for(device: str) -> dict[str, Any]:
    """Ray ``.options(...)`` keywords for a replica on ``device`` (num_gpus / resources)."""
    res = ray_resources_for(device)
    opts: dict[str, Any] = {}
    if "GPU" in res:
        opts["num_gpus"] = res["GPU"]
    rest = {k: v for k, v in res.items() if k != "GPU"}
    if rest:
        opts["resources"] = rest
    return opts


def synchronize(device: Any) -> None:
    """Wait for queued kernels on ``device`` (timing); a no-op on CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]
