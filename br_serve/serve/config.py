"""Validated, immutable configuration of the serving graph (the edge for builder args).

``serve run graphs.balance_route:build replicas=8 policy=brh`` hands every argument as
a string; :func:`parse_graph_config` routes each to its field (a path such as
``step.b_s``, written ``step.b_s`` or ``step_b_s``; see :mod:`br_serve.config.tree`),
coerces and validates them once, and raises :class:`GraphConfigError` (a
``ValueError``) whose message starts with the bad field's path, e.g.
``replicas: Input should be greater than or equal to 1 (got 0)`` or
``policy.options.r_max: ...``. The validated object is what the deployments and actors
receive; nothing is built while validating.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from br_serve.config import ClusterConfig, PoolConfig, PrefillConfig, Section
from br_serve.config.tree import parse_config
from br_serve.core.step import StepModel, per_replica
from br_serve.engine.factory import EngineConfig, EngineTiming
from br_serve.engine.remote_spec import REMOTE_ENGINES, RemoteConfig

#: Environment variable read for the API key when no ``serve.api_key`` is given.
API_KEY_ENV = "BR_SERVE_API_KEY"


#: ``pool.dispatch_ahead`` when not given, with remote engines (which queue per rank)
DISPATCH_AHEAD_REMOTE = 2


class GraphConfigError(ValueError):
    """Invalid graph configuration; the message starts with the bad field's path."""


class ServePrefillConfig(PrefillConfig):
    """The graph's Prefill deployment; ``p0_s`` / ``p1_s_per_token`` time the emulated
    engine's prefill."""

    replicas: int = Field(default=2, ge=1, le=256)
    """Serve replicas of the Prefill deployment (local engines only; with
    ``engine=vllm|sglang`` each ingress replica calls the prefill servers itself)."""
    p0_s: float = Field(default=0.0, ge=0)
    """emulated: seconds per prefill (0: as fast as the host allows)."""
    p1_s_per_token: float = Field(default=0.0, ge=0)
    """emulated: prefill seconds per prompt token."""


class ServePoolConfig(PoolConfig):
    """The scheduler's prompt pool."""

    capacity: int = Field(default=1024, ge=1)
    """Most requests in the pool (429 beyond it)."""
    ttl_s: float = Field(default=240.0, gt=0)
    """vllm/sglang: most seconds a prefilled request may wait in the pool; after it its
    prefill KV is released on the engine (cancel / abort) and the request is
    re-prefilled when it is bound. Keep it below the engine's own hold bound
    (``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT``, 480 s; SGLang's bootstrap timeout, 300 s)."""
    dispatch_ahead: int | None = Field(default=None, ge=0, le=1024)
    """Requests the scheduler may bind to a decode rank beyond its ``slots``: the
    engine queues them and starts one at its next step boundary when a slot frees,
    instead of the slot idling until the scheduler heard of the finish, ticked and the
    decode call and KV pull went through. The policy sees ``slots + dispatch_ahead``
    places per rank, and its snapshot tells the requests queued at the engine (bound
    after the rank's first ``slots``: the engine admits in order) apart from the
    running ones (br0 balances the load a new request meets when it starts: its option
    ``queued_load``), so it still chooses which request and which rank. A tick offers
    free engine slots first, and queue places only for the pool's requests beyond
    ``dispatch_ahead`` per rank (a backlog); every other request stays in the pool
    (late binding), so a draining pool's last requests go to the ranks that free a slot
    first. None: 2 with remote engines
    (``engine.name=vllm|sglang``, which queue per rank), 0 with the graph's own engines,
    which have no queue (a value > 0 is refused there). It acts only while every engine
    slot is busy: in a saturated backlog (Mooncake, G = 8, docs/peers.md) 0 gave 3.4%
    more output tokens per second and an 18% lower TPOT P95 than 2, and a 19% higher
    TTFT P50; at a TTFT-bound SLO (64-request bursts, same cell) 0 carried 18% less
    capacity than 2."""


class TransportConfig(Section):
    """How KV moves from a prefill worker to a decode replica (local engines)."""

    name: Literal["objref", "mooncake"] = "objref"
    """Ray object refs, or a Mooncake store."""
    mooncake_master: str | None = None
    """``host:port`` of the Mooncake master every prefill worker and decode replica
    connects to (``name=mooncake``); unset, each process reads ``MOONCAKE_MASTER``,
    else ``127.0.0.1:50051``."""

    @field_validator("mooncake_master")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected host:port with a port in 1..65535")
        return v


class ServeConfig(Section):
    """The HTTP surface, the application and its actors."""

    app_name: str = "balance_route"
    """Serve application name; also prefixes the named actors."""
    model: str = "br-emulated"
    """The model id clients must send."""
    max_context_tokens: int = Field(default=131072, ge=2)
    """Bound on prompt + max_tokens (beyond it: a 400 naming the maximum context length)."""
    host: str = "127.0.0.1"
    """HTTP bind address for ``deploy`` / ``br-serve serve`` (refused as a ``serve run``
    builder argument: Serve's proxy starts before the app is built)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port (as ``host``)."""
    front: Literal["proxy", "haproxy"] = "proxy"
    """The HTTP front door, chosen where ``br-serve`` starts Ray (``deploy``, ``serve``,
    ``demo``, the benches): ``proxy``, Serve's Python HTTP proxy, which relays every
    request and every streamed chunk to the ingress replica through Ray; ``haproxy``,
    Serve's HAProxy ingress (``RAY_SERVE_ENABLE_HA_PROXY=1``): HAProxy listens on
    ``host:port`` and forwards each connection to the ingress replica's own HTTP server,
    which cuts the graph's CPU per streamed token (docs/serving.md, "Front door").
    Refused as a ``serve run`` builder argument: it is fixed when Ray starts."""
    api_key: str | None = None
    """When set (or ``BR_SERVE_API_KEY`` is), every endpoint but ``/health`` needs
    ``Authorization: Bearer <key>``."""
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
    ingress_replicas: int = Field(default=1, ge=1)
    """Replicas of the HTTP ingress (Serve's ``num_replicas``); each streams its own
    requests, all share the graph's one scheduler and decode replicas."""

    @field_validator("api_key")
    @classmethod
    def _nonempty_key(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be a non-empty string when given")
        return v


def _section_value(data: Mapping[str, Any], name: str, field: str) -> Any:
    sec = data.get(name)
    if isinstance(sec, BaseModel):
        return getattr(sec, field, None)
    if isinstance(sec, Mapping):
        return sec.get(field)
    return sec if field == "name" else None


class GraphConfig(ClusterConfig):
    """Every option of the Ray Serve graph: the cluster and router shared with the
    simulator (:class:`~br_serve.config.ClusterConfig`) and the sections ``engine``,
    ``remote``, ``transport`` and ``serve``. Frozen after validation.

    Topology: ``replicas`` decode replica actors (G) in lock-step, ``prefill.replicas``
    Serve replicas for prefill, one scheduler actor. ``engine.device`` other than
    ``cpu`` makes every prefill and decode replica request one accelerator from Ray
    (:meth:`replica_actor_options`).
    """

    replicas: int = Field(default=4, ge=1, le=256)
    """G: decode replica actors in lock-step."""
    prefill: ServePrefillConfig = ServePrefillConfig()
    """The Prefill deployment (and the emulated engine's prefill time)."""
    pool: ServePoolConfig = ServePoolConfig()
    """The scheduler's prompt pool."""
    engine: EngineConfig = EngineConfig()
    """The engine every prefill worker and decode replica runs."""
    remote: RemoteConfig = RemoteConfig()
    """Where the remote engines are (``engine.name=vllm|sglang``)."""
    transport: TransportConfig = TransportConfig()
    """The KV transport of local engines."""
    serve: ServeConfig = ServeConfig()
    """The HTTP surface, the application and its actors."""

    @model_validator(mode="before")
    @classmethod
    def _remote_replicas(cls, data: Any) -> Any:
        """Remote engines: ``replicas`` is the number of decode ranks (derived from
        ``remote.decode_urls`` / ``remote.dp_size``; a given value must match)."""
        if not isinstance(data, Mapping):
            return data
        engine = _section_value(data, "engine", "name")
        if engine not in REMOTE_ENGINES:
            return data
        remote = data.get("remote") or {}
        try:
            spec = remote if isinstance(remote, RemoteConfig) else RemoteConfig(**remote)
        except ValidationError:
            return data  # the field's own validation names it
        given = data.get("replicas")
        try:
            ranks = spec.check_remote(str(engine), None if given is None else int(given))
        except ValueError as exc:
            msg = str(exc)
            raise ValueError(msg if msg.startswith("replicas:") else f"remote.{msg}") \
                from None
        return {**data, "replicas": ranks}

    @model_validator(mode="after")
    def _graph_checks(self) -> GraphConfig:
        if not self.engine.is_remote and (self.remote.prefill_urls or self.remote.decode_urls
                                          or self.remote.dp_size):
            raise ValueError(f"remote.prefill_urls: only for engine.name=vllm|sglang "
                             f"(engine.name is {self.engine.name!r})")
        v = self.engine.step_factor
        if isinstance(v, tuple) and len(v) != self.replicas:
            raise ValueError(f"engine.step_factor: {len(v)} values for {self.replicas} "
                             "replicas")
        if not self.engine.is_remote and self.pool.dispatch_ahead:
            raise ValueError(f"pool.dispatch_ahead: only for engine.name=vllm|sglang (the "
                             f"engine {self.engine.name!r} has no queue per rank)")
        if self.predictor.simulator_only:
            raise ValueError(f"predictor.name: {self.predictor.name!r} reads true output "
                             "lengths, which only the simulator knows")
        return self

    @property
    def is_remote(self) -> bool:
        """The engines run outside the graph (it proxies them)."""
        return self.engine.is_remote

    def dispatch_ahead(self, remote: bool | None = None) -> int:
        """``pool.dispatch_ahead`` resolved (None: 2 for remote engines, else 0);
        ``remote`` overrides whether the engines are remote (a benchmark's base config
        describes the graph it will start in front of remote engines)."""
        if self.pool.dispatch_ahead is not None:
            return self.pool.dispatch_ahead
        is_remote = self.engine.is_remote if remote is None else remote
        return DISPATCH_AHEAD_REMOTE if is_remote else 0

    def places_per_replica(self) -> int:
        """What the scheduler may bind to one decode rank: ``slots`` running plus
        ``dispatch_ahead`` queued at the engine."""
        return self.slots + self.dispatch_ahead()

    def replica_actor_options(self) -> dict[str, Any]:
        """Ray actor options of one prefill worker or decode replica.

        ``num_cpus=0`` (they mostly wait), plus one accelerator off-CPU: ``num_gpus=1``
        for cuda, ``resources={"NPU": 1}`` for npu, so Ray places each replica on its own
        device and sets ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``.
        """
        opts: dict[str, Any] = {"num_cpus": 0}
        if self.engine.device != "cpu":
            from br_serve.engine.device import ray_actor_options_for

            opts.update(ray_actor_options_for(self.engine.device))
        return opts

    def kv_transport(self) -> str:
        """The transport every prefill worker, decode replica and the keeper use:
        ``remote`` (a ticket of the engine's transfer parameters) with a remote engine,
        else ``transport.name``."""
        return "remote" if self.is_remote else self.transport.name

    def keeper_ttl_s(self) -> float | None:
        """The keeper's bound on an unreleased KV (None: its default)."""
        return self.pool.ttl_s if self.is_remote else None

    def context_limit_tokens(self) -> int:
        """The most prompt + output tokens one request may ask for: ``max_context_tokens``,
        and no more than a replica's KV (``kv_limit_tokens``) holds."""
        limit = self.serve.max_context_tokens
        return limit if self.kv_limit_tokens is None else min(limit, self.kv_limit_tokens)

    def channel_host(self) -> str | None:
        """Where an ingress replica's event channel listens (None: ``event_channel=ray``);
        call it inside a Ray worker."""
        if self.serve.event_channel != "tcp":
            return None
        if self.serve.event_channel_host:
            return self.serve.event_channel_host
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def resolved_api_key(self) -> str | None:
        """``serve.api_key``, else the environment variable, else no key."""
        return self.serve.api_key or os.environ.get(API_KEY_ENV) or None

    def router_step_model(self) -> StepModel:
        """The step model the router prices steps with: the configured one, times
        ``engine.slowdown`` (the engines' clock)."""
        return self.step_model().scaled(self.engine.slowdown, self.replicas)

    def emulated_step_model(self, scaled: bool = False) -> StepModel:
        """The step model the emulated engines run: the configured one times
        ``engine.step_factor`` (and ``engine.slowdown`` when ``scaled``)."""
        f = per_replica(self.engine.step_factor, self.replicas)
        if scaled:
            f = tuple(x * self.engine.slowdown for x in f)
        return self.step_model().scaled(f, self.replicas)

    def engine_timing(self, replica: int) -> EngineTiming:
        """The emulated engine's durations for decode replica ``replica`` (or a prefill
        worker: pass 0), unscaled (the engine applies ``engine.slowdown``)."""
        return EngineTiming(self.emulated_step_model().replica(replica, self.replicas),
                            self.prefill.p0_s, self.prefill.p1_s_per_token)


def parse_graph_config(data: Mapping[str, Any] | GraphConfig | None = None,
                       **overrides: Any) -> GraphConfig:
    """Build a :class:`GraphConfig` from builder arguments (any spelling of a path;
    strings are coerced; ``none`` / ``""`` is None for an optional field).

    Raises:
        GraphConfigError: ``"<path>: <reason> (got <value>)"`` for the first bad field;
            an unknown argument is ``"<name>: Extra inputs are not permitted"``.
    """
    return parse_config(GraphConfig, data, GraphConfigError, **overrides)


def field_path(key: str) -> tuple[str, ...]:
    """The path a builder argument names (``serve_port`` -> ``("serve", "port")``)."""
    from br_serve.config.tree import resolve

    return resolve(GraphConfig, key)


#: Flat names of the graph's configuration before the sections (results written then
#: store them): old name -> path. Only :func:`from_stored` reads them; the names a user
#: types are the paths.
RENAMED = {
    "model_path": "engine.model_path", "device": "engine.device", "dtype": "engine.dtype",
    "kv_bytes_per_token": "engine.kv_bytes_per_token", "time_scale": "engine.slowdown",
    "emulated_step_factor": "engine.step_factor", "prefill_urls": "remote.prefill_urls",
    "decode_urls": "remote.decode_urls", "dp_size": "remote.dp_size",
    "engine_api_key": "remote.api_key", "bootstrap_port": "remote.bootstrap_port",
    "mooncake_master": "transport.mooncake_master", "app_name": "serve.app_name",
    "model": "serve.model", "max_context_tokens": "serve.max_context_tokens",
    "host": "serve.host", "port": "serve.port", "api_key": "serve.api_key",
    "barrier_timeout_s": "serve.barrier_timeout_s", "event_channel": "serve.event_channel",
    "event_channel_host": "serve.event_channel_host", "namespace": "serve.namespace",
}


def from_stored(data: Mapping[str, Any]) -> GraphConfig:
    """A configuration stored in a result file, old flat names (:data:`RENAMED`)
    included."""
    return parse_graph_config({RENAMED.get(k, k): v for k, v in data.items()})
