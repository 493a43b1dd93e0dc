"""Pick an engine by name (what the serving graph is built from); KV transports come
from :mod:`br_serve.transport.factory`.

Heavy or optional parts are imported lazily: the torch engine only for ``engine.name=torch``,
the device helpers only off-CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from br_serve.core.step import Coef, StepModel
from br_serve.engine.base import Engine
from br_serve.engine.remote_spec import REMOTE_ENGINES


class EngineConfig(BaseModel):
    """Which engine every prefill worker and decode replica runs (the graph's ``engine``
    section). Frozen.

    The step and prefill time models and the slot count are the cluster's (shared with
    the simulator) and are passed to :func:`make_engine` beside this section; where the
    remote engines are is the ``remote`` section
    (:class:`~br_serve.engine.remote_spec.RemoteConfig`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: Literal["emulated", "torch", "vllm", "sglang"] = "emulated"
    """``emulated`` (time from the step model, runs anywhere), ``torch`` (a local
    Hugging Face causal LM), or a remote PD deployment the graph routes: ``vllm``
    (vLLM / vllm-ascend with a KV connector) or ``sglang`` (``--disaggregation-mode``)."""
    model_path: str | None = None
    """torch: directory of the model (required)."""
    device: str = "cpu"
    """torch: ``cpu``, ``cuda[:i]`` or ``npu[:i]``."""
    dtype: str = "float32"
    """torch: parameter dtype."""
    kv_bytes_per_token: int = Field(default=16, ge=1)
    """emulated: bytes of KV payload per prompt token (what the transport moves)."""
    slowdown: float = Field(default=1.0, gt=0)
    """emulated: multiplies every modelled duration, in the engines and in the router's
    step model alike (2: everything runs twice as slow, to watch it)."""
    step_factor: Coef = 1.0
    """emulated: multiplies replica ``g``'s modelled step time (``a``, ``b``, ``c``) in
    its engine only: a heterogeneity the configured step model does not describe (a
    slower host, throttling), which only online calibration (``cost=time``) can see.
    One value or one per replica; 1: the engines run the configured model."""

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("step_factor", mode="before")
    @classmethod
    def _factor_list(cls, v: Any) -> Any:
        if isinstance(v, str) and "," in v:  # "1,1,1.5,1.5" from a command line
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return tuple(v) if isinstance(v, list) else v

    @field_validator("step_factor")
    @classmethod
    def _positive_factor(cls, v: Coef) -> Coef:
        vals = v if isinstance(v, tuple) else (v,)
        if not vals or any(x <= 0 for x in vals):
            raise ValueError("must be > 0 (one value, or one per replica)")
        return v

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        from br_serve.engine.device import parse_device

        parse_device(v)  # DeviceError is a ValueError: reported against this field
        return v

    @model_validator(mode="after")
    def _torch_needs_model(self) -> EngineConfig:
        if self.name == "torch" and not self.model_path:
            raise ValueError("model_path: required when name is 'torch'")
        return self

    @property
    def is_remote(self) -> bool:
        """The engines run outside the graph (it proxies them)."""
        return self.name in REMOTE_ENGINES


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """The modelled durations of one replica's emulated engine (seconds, unscaled)."""

    step: StepModel = StepModel()
    prefill_p0_s: float = 0.0
    prefill_p1_s_per_token: float = 0.0


def make_engine(engine: EngineConfig, timing: EngineTiming | None = None, slots: int = 16,
                seed: int = 0) -> Engine:
    """The engine ``engine`` describes (both the prefill and the decode half).

    ``timing`` drives the emulated engine; ``slots`` bounds a torch decode batch.

    Raises:
        ValueError: a remote engine (the graph builds its proxies itself).
    """
    if engine.is_remote:
        raise ValueError(f"engine.name: {engine.name!r} runs outside the graph; "
                         "make_engine builds only local engines")
    if engine.name == "emulated":
        from br_serve.engine.emulated import EmulatedEngine

        t = timing or EngineTiming()
        return EmulatedEngine(
            kv_bytes_per_token=engine.kv_bytes_per_token, step=t.step,
            slowdown=engine.slowdown, prefill_p0_s=t.prefill_p0_s,
            prefill_p1_s_per_token=t.prefill_p1_s_per_token)
    from br_serve.engine.torch_engine import TorchEngine

    assert engine.model_path is not None  # checked by EngineConfig
    return TorchEngine(engine.model_path, device=engine.device, dtype=engine.dtype,
                       max_batch=slots, seed=seed)


def collective_backend_for(device: str) -> str:
    """The barrier's torch.distributed backend: gloo on CPU, else from the device helper."""
    if device == "cpu":
        return "gloo"
    from br_serve.engine.device import collective_backend

    return str(collective_backend(device))
