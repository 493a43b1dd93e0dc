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

from pydantic import ConfigDict, Field, field_validator, model_validator

from br_serve.config import ClusterConfig, validated
from br_serve.config.cluster import Coef, per_replica
from br_serve.engine.factory import EngineSpec, EngineTiming
from br_serve.engine.remote_spec import REMOTE_ENGINES

#: Environment variable read for the API key when no ``api_key`` argument is given.
API_KEY_ENV = "BR_SERVE_API_KEY"


class GraphConfigError(ValueError):
    """Invalid graph configuration; the message starts with the bad field's name."""


class GraphConfig(ClusterConfig, EngineSpec):
    """Every option of the Ray Serve graph: the cluster and router shared with the
    simulator (:class:`~br_serve.config.ClusterConfig`), the engine
    (:class:`~br_serve.engine.factory.EngineSpec`) and the serving options below.
    Frozen after validation.

    Topology: ``replicas`` decode replica actors (G) in lock-step, ``prefill_replicas``
    Serve replicas for prefill, one scheduler actor. ``device`` other than ``cpu``
    makes every prefill and decode replica request one accelerator from Ray
    (:meth:`replica_actor_options`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    # the shared fields whose serving defaults differ from the simulator's
    replicas: int = Field(default=4, ge=1, le=256)
    """G: decode replica actors in lock-step."""
    prefill_replicas: int = Field(default=2, ge=1, le=256)
    """Serve replicas of the Prefill deployment."""
    prefill_p0_s: float = Field(default=0.0, ge=0)
    """emulated: seconds per prefill (0: as fast as the host allows)."""
    prefill_p1_s_per_token: float = Field(default=0.0, ge=0)
    """emulated: prefill seconds per prompt token."""

    app_name: str = "balance_route"
    """Serve application name; also prefixes the named actors."""
    model: str = "br-emulated"
    """The model id clients must send."""
    pool_capacity: int = Field(default=1024, ge=1)
    """Prompt pool bound (429 beyond it)."""
    max_context_tokens: int = Field(default=131072, ge=2)
    """Bound on prompt + max_tokens (beyond it: a 400 naming the maximum context length)."""
    transport: Literal["objref", "mooncake"] = "objref"
    """KV transport: Ray object refs or a Mooncake store."""
    mooncake_master: str | None = None
    """``host:port`` of the Mooncake master every prefill worker and decode replica
    connects to (``transport=mooncake``); unset, each process reads
    ``MOONCAKE_MASTER``, else ``127.0.0.1:50051``."""
    host: str = "127.0.0.1"
    """HTTP bind address for ``deploy`` / ``br-serve serve`` (refused as a ``serve run``
    builder argument: Serve's proxy starts before the app is built)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port (as ``host``)."""
    api_key: str | None = None
    """When set (or ``BR_SERVE_API_KEY`` is), every endpoint but ``/health`` needs
    ``Authorization: Bearer <key>``."""
    emulated_step_factor: Coef = 1.0
    """emulated: multiplies replica ``g``'s modelled step time (``a``, ``b``, ``c``) in its
    engine only: a heterogeneity the configured step model does not describe (a slower
    host, throttling), which only online calibration (``cost=time``) can see. One value
    or one per replica; 1: the engines run the configured model."""
    barrier_timeout_s: float = Field(default=10.0, gt=0)
    """Bound on one collective: a dead peer is detected within it."""
    event_channel: Literal["tcp", "ray"] = "tcp"
    """How decode replicas deliver token events to an ingress replica: ``tcp``, each
    writes them to a TCP port the ingress replica opens on its node's address
    (``event_channel_host``), authenticated by a random token handed over inside a Ray
    call (a replica that cannot connect is polled instead); ``ray``, the ingress
    long-polls every replica after every step (one Ray call each: ~2 ms of CPU here)."""
    event_channel_host: str | None = None
    """The address the event channel listens on (default: the node's IP as Ray knows
    it; set ``127.0.0.1`` when every decode replica runs on the ingress's node)."""
    namespace: str = "br_serve"
    """Ray namespace of the named actors."""

    @model_validator(mode="before")
    @classmethod
    def _remote_replicas(cls, data: Any) -> Any:
        """Remote engines: ``replicas`` is the number of decode ranks (derived from
        ``decode_urls`` / ``dp_size``; a given value must match)."""
        if not isinstance(data, dict) or data.get("engine") not in REMOTE_ENGINES:
            return data
        from br_serve.engine.remote_spec import RemoteSpec

        spec = RemoteSpec(**{k: data[k] for k in RemoteSpec.model_fields if k in data})
        given = data.get("replicas")
        ranks = spec.check_remote(str(data["engine"]),
                                  None if given is None else int(given))
        return {**data, "replicas": ranks}

    @field_validator("emulated_step_factor", mode="before")
    @classmethod
    def _factor_list(cls, v: Any) -> Any:
        if isinstance(v, str) and "," in v:  # "1,1,1.5,1.5" from a command line
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return tuple(v) if isinstance(v, list) else v

    @field_validator("emulated_step_factor")
    @classmethod
    def _positive_factor(cls, v: Coef) -> Coef:
        vals = v if isinstance(v, tuple) else (v,)
        if not vals or any(x <= 0 for x in vals):
            raise ValueError("must be > 0 (one value, or one per replica)")
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

    @model_validator(mode="after")
    def _factor_per_replica(self) -> GraphConfig:
        v = self.emulated_step_factor
        if isinstance(v, tuple) and len(v) != self.replicas:
            raise ValueError(f"emulated_step_factor: {len(v)} values for {self.replicas} "
                             "replicas")
        return self

    @model_validator(mode="after")
    def _live_predictor(self) -> GraphConfig:
        horizon = self.predictor_horizon()
        if self.predictor is not None and horizon is not None:
            from br_serve.core.predictor import reads_true_remaining
            from predictors import make_predictor

            pred = make_predictor(self.predictor, horizon=horizon,
                                  model_path=self.predictor_model_path, seed=self.seed,
                                  **self.predictor_options)
            if reads_true_remaining(pred):
                raise ValueError(f"predictor: {self.predictor!r} reads true output "
                                 "lengths, which only the simulator knows")
        return self

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

    def kv_transport(self) -> str:
        """The transport every prefill worker, decode replica and the keeper use:
        ``remote`` (a ticket of the engine's transfer parameters) with a remote engine,
        else :attr:`transport`."""
        return "remote" if self.is_remote else self.transport

    def keeper_ttl_s(self) -> float | None:
        """The keeper's bound on an unreleased KV (None: its default)."""
        return self.pool_ttl_s if self.is_remote else None

    def channel_host(self) -> str | None:
        """Where an ingress replica's event channel listens (None: ``event_channel=ray``);
        call it inside a Ray worker."""
        if self.event_channel != "tcp":
            return None
        if self.event_channel_host:
            return self.event_channel_host
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def resolved_api_key(self) -> str | None:
        """The builder argument, else the environment variable, else no key."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None

    def emulated_coefficients(self) -> tuple[tuple[float, ...], tuple[float, ...],
                                             tuple[float, ...]]:
        """``(a, b, c)`` per replica as the emulated engines run them (unscaled): the
        configured step model times :attr:`emulated_step_factor`."""
        f = per_replica(self.emulated_step_factor, self.replicas)
        a, b, c = self.coefficients(self.replicas)
        return (tuple(x * y for x, y in zip(a, f, strict=True)),
                tuple(x * y for x, y in zip(b, f, strict=True)),
                tuple(x * y for x, y in zip(c, f, strict=True)))

    def engine_timing(self, replica: int) -> EngineTiming:
        """The emulated engine's durations for decode replica ``replica`` (or a prefill
        worker: pass 0), unscaled (the engine applies ``time_scale``)."""
        a, b, c = self.emulated_coefficients()
        return EngineTiming(a[replica], b[replica], c[replica], self.prefill_p0_s,
                            self.prefill_p1_s_per_token)


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
    for key in ("model_path", "api_key", "predictor", "predictor_model_path",
                "mooncake_master", "remote_model", "engine_api_key", "dp_size",
                "bootstrap_port"):
        if isinstance(base.get(key), str) and base[key].lower() in ("", "none", "null"):
            base[key] = None
    return validated(GraphConfig, base, GraphConfigError)
