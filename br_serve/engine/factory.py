"""Pick an engine by name (what the serving graph is built from); KV transports come
from :mod:`br_serve.transport.factory`.

Heavy or optional parts are imported lazily: the torch engine only for ``kind="torch"``,
the device helpers only off-CPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from br_serve.engine.base import Engine


class EngineSpec(BaseModel):
    """What to build in every prefill worker and decode replica. Frozen.

    Emulated-only fields: ``kv_bytes_per_token``, ``step_a_s_per_token``, ``step_b_s``,
    ``time_scale`` (multiplies every modelled duration), ``prefill_base_s`` and
    ``prefill_s_per_token``. Torch-only: ``model_path`` (required), ``device``,
    ``dtype``, ``max_batch``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["emulated", "torch"] = "emulated"
    model_path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    kv_bytes_per_token: int = Field(default=16, ge=1)
    step_a_s_per_token: float = Field(default=5e-7, ge=0)
    step_b_s: float = Field(default=0.03, ge=0)
    time_scale: float = Field(default=1.0, gt=0)
    prefill_base_s: float = Field(default=0.0, ge=0)
    prefill_s_per_token: float = Field(default=0.0, ge=0)
    max_batch: int = Field(default=16, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _torch_needs_model(self) -> EngineSpec:
        if self.kind == "torch" and not self.model_path:
            raise ValueError("model_path: required when engine is 'torch'")
        return self


def make_engine(spec: EngineSpec) -> Engine:
    """The engine ``spec`` describes (both the prefill and the decode half)."""
    if spec.kind == "emulated":
        from br_serve.engine.emulated import EmulatedEngine

        return EmulatedEngine(
            kv_bytes_per_token=spec.kv_bytes_per_token,
            step_a_s_per_token=spec.step_a_s_per_token, step_b_s=spec.step_b_s,
            time_scale=spec.time_scale, prefill_base_s=spec.prefill_base_s,
            prefill_s_per_token=spec.prefill_s_per_token)
    from br_serve.engine.torch_engine import TorchEngine

    assert spec.model_path is not None  # checked by EngineSpec
    return TorchEngine(spec.model_path, device=spec.device, dtype=spec.dtype,
                       max_batch=spec.max_batch, seed=spec.seed)


def collective_backend_for(device: str) -> str:
    """The barrier's torch.distributed backend: gloo on CPU, else from the device helper."""
    if device == "cpu":
        return "gloo"
    from br_serve.engine.device import collective_backend

    return str(collective_backend(device))
