"""Pick an engine by name (what the serving graph is built from); KV transports come
from :mod:`br_serve.transport.factory`.

Heavy or optional parts are imported lazily: the torch engine only for ``engine="torch"``,
the device helpers only off-CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from br_serve.engine.base import Engine
from br_serve.engine.remote_spec import REMOTE_ENGINES, RemoteSpec


class EngineSpec(RemoteSpec):
    """Which engine every prefill worker and decode replica runs. Frozen.

    A mixin of the serving graph's configuration: the step and prefill time models
    and the slot count live in :class:`~br_serve.config.ClusterConfig` (shared with the
    simulator) and are passed to :func:`make_engine` beside this spec. The remote
    engines' fields are :class:`~br_serve.engine.remote_spec.RemoteSpec`'s.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    engine: Literal["emulated", "torch", "vllm", "sglang"] = "emulated"
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
    time_scale: float = Field(default=1.0, gt=0)
    """emulated: multiplies every modelled duration (slow a run down to watch it)."""

    @model_validator(mode="after")
    def _torch_needs_model(self) -> EngineSpec:
        if self.engine == "torch" and not self.model_path:
            raise ValueError("model_path: required when engine is 'torch'")
        if not self.is_remote and (self.prefill_urls or self.decode_urls or self.dp_size):
            raise ValueError(f"prefill_urls: only for engine=vllm|sglang (engine is "
                             f"{self.engine!r})")
        return self

    @property
    def is_remote(self) -> bool:
        """The engines run outside the graph (it proxies them)."""
        return self.engine in REMOTE_ENGINES


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """The modelled durations of one replica's emulated engine (seconds)."""

    step_a_s_per_token: float = 5e-7
    step_b_s: float = 0.03
    step_c_s_per_request: float = 0.0
    prefill_p0_s: float = 0.0
    prefill_p1_s_per_token: float = 0.0


def make_engine(spec: EngineSpec, timing: EngineTiming | None = None, slots: int = 16,
                seed: int = 0) -> Engine:
    """The engine ``spec`` describes (both the prefill and the decode half).

    ``timing`` drives the emulated engine; ``slots`` bounds a torch decode batch.

    Raises:
        ValueError: a remote engine (the graph builds its proxies itself).
    """
    if spec.is_remote:
        raise ValueError(f"engine: {spec.engine!r} runs outside the graph; "
                         "make_engine builds only local engines")
    if spec.engine == "emulated":
        from br_serve.engine.emulated import EmulatedEngine

        t = timing or EngineTiming()
        return EmulatedEngine(
            kv_bytes_per_token=spec.kv_bytes_per_token,
            step_a_s_per_token=t.step_a_s_per_token, step_b_s=t.step_b_s,
            step_c_s_per_request=t.step_c_s_per_request,
            time_scale=spec.time_scale, prefill_p0_s=t.prefill_p0_s,
            prefill_p1_s_per_token=t.prefill_p1_s_per_token)
    from br_serve.engine.torch_engine import TorchEngine

    assert spec.model_path is not None  # checked by EngineSpec
    return TorchEngine(spec.model_path, device=spec.device, dtype=spec.dtype,
                       max_batch=slots, seed=seed)


def collective_backend_for(device: str) -> str:
    """The barrier's torch.distributed backend: gloo on CPU, else from the device helper."""
    if device == "cpu":
        return "gloo"
    from br_serve.engine.device import collective_backend

    return str(collective_backend(device))
