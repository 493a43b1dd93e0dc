"""Validated, immutable configuration of the serving graph (the edge for builder args).

``serve run graphs.balance_route:build replicas=8 policy=brh`` hands every argument as
a string; :func:`parse_graph_config` coerces and validates them with pydantic and
raises :class:`GraphConfigError` (a ``ValueError``) whose message starts with the name
of the bad field, e.g. ``replicas: Input should be greater than or equal to 1 (got 0)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from br_serve.core.config import describe_validation_error
from br_serve.engine.factory import EngineSpec

#: Environment variable read for the API key when no ``api_key`` argument is given.
API_KEY_ENV = "BR_SERVE_API_KEY"


class GraphConfigError(ValueError):
    """Invalid graph configuration; the message starts with the bad field's name."""


class GraphConfig(BaseModel):
    """Every option of the Ray Serve graph. Frozen after validation.

    Topology: ``replicas`` decode replica actors (G) in lock-step, ``prefill_replicas``
    Serve replicas for prefill, one scheduler actor. ``pool_capacity`` bounds the
    prompt pool (429 beyond it). ``max_context_tokens`` bounds prompt + max_tokens
    (beyond it a 400 naming the maximum context length). ``api_key``: when set (or
    ``BR_SERVE_API_KEY`` is set), every endpoint except ``/health`` needs
    ``Authorization: Bearer <key>``.
    ``barrier_timeout_s`` bounds one collective: a dead peer is detected within it.
    ``mooncake_master`` (``host:port``, used with ``transport=mooncake``): the Mooncake
    master every prefill worker and decode replica connects to; unset, each process
    reads ``MOONCAKE_MASTER`` from its own environment, else ``127.0.0.1:50051``.
    ``device`` other than ``cpu`` makes every prefill and decode replica request one
    accelerator from Ray (:meth:`replica_actor_options`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    app_name: str = "balance_route"
    model: str = "br-emulated"
    replicas: int = Field(default=4, ge=1, le=256)
    prefill_replicas: int = Field(default=2, ge=1, le=256)
    policy: str = "br0"
    horizon: int = Field(default=80, ge=0, le=4096)
    predictor: str = "survives"
    predictor_model_path: str | None = None
    slots: int = Field(default=16, ge=1, le=4096)
    pool_capacity: int = Field(default=1024, ge=1)
    max_context_tokens: int = Field(default=131072, ge=2)
    engine: Literal["emulated", "torch"] = "emulated"
    model_path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    kv_bytes_per_token: int = Field(default=16, ge=1)
    step_a_s_per_token: float = Field(default=5e-7, ge=0)
    step_b_s: float = Field(default=0.03, ge=0)
    time_scale: float = Field(default=1.0, gt=0)
    prefill_base_s: float = Field(default=0.0, ge=0)
    prefill_s_per_token: float = Field(default=0.0, ge=0)
    transport: Literal["objref", "mooncake"] = "objref"
    mooncake_master: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key: str | None = None
    barrier_timeout_s: float = Field(default=10.0, gt=0)
    seed: int = 0
    namespace: str = "br_serve"

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        from br_serve.core import policy_names

        if v not in policy_names():
            raise ValueError(f"unknown policy {v!r}; known: {', '.join(sorted(policy_names()))}")
        return v

    @field_validator("predictor")
    @classmethod
    def _known_predictor(cls, v: str) -> str:
        from br_serve.serve.predictor import predictor_names

        names = predictor_names()
        if v not in names:
            raise ValueError(f"unknown predictor {v!r}; known: {', '.join(sorted(names))}")
        return v

    @field_validator("api_key")
    @classmethod
    def _nonempty_key(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be a non-empty string when given")
        return v

    @field_validator("mooncake_master")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected host:port with a port in 1..65535")
        return v

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        from br_serve.engine.device import parse_device

        parse_device(v)  # DeviceError is a ValueError: reported against this field
        return v

    def replica_actor_options(self) -> dict[str, Any]:
        """Ray actor options of one prefill worker or decode replica.

        ``num_cpus=0`` (they mostly wait), plus one accelerator off-CPU: ``num_gpus=1``
        for cuda, ``resources={"NPU": 1}`` for npu, so Ray places each replica on its own
        device and sets ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``.
        """
        opts: dict[str, Any] = {"num_cpus": 0}
        if self.device != "cpu":
            from br_serve.engine.device import ray_actor_options_for

            opts.update(ray_actor_options_for(self.device))
        return opts

    def resolved_api_key(self) -> str | None:
        """The builder argument, else the environment variable, else no key."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None

    def engine_spec(self) -> EngineSpec:
        return EngineSpec(
            kind=self.engine, model_path=self.model_path, device=self.device,
            dtype=self.dtype, kv_bytes_per_token=self.kv_bytes_per_token,
            step_a_s_per_token=self.step_a_s_per_token, step_b_s=self.step_b_s,
            time_scale=self.time_scale, prefill_base_s=self.prefill_base_s,
            prefill_s_per_token=self.prefill_s_per_token, max_batch=self.slots,
            seed=self.seed)


def parse_graph_config(data: Mapping[str, Any] | GraphConfig | None = None,
                       **overrides: Any) -> GraphConfig:
    """Build a :class:`GraphConfig` from builder arguments (strings are coerced).

    Raises:
        GraphConfigError: ``"<field>: <reason> (got <value>)"`` for the first bad field;
            unknown arguments are reported as ``"<name>: Extra inputs are not permitted"``.
    """
    base: dict[str, Any] = {}
    if isinstance(data, GraphConfig):
        base = data.model_dump()
    elif data is not None:
        base = dict(data)
    base.update(overrides)
    # "none"/"" from a command line mean "not given" for optional strings.
    for key in ("model_path", "api_key", "predictor_model_path", "mooncake_master"):
        if isinstance(base.get(key), str) and base[key].lower() in ("", "none", "null"):
            base[key] = None
    try:
        return GraphConfig(**base)
    except ValidationError as exc:
        raise GraphConfigError(describe_validation_error(exc)) from None
