"""Build and deploy the Ray Serve application (the only place that wires deployments).

``build(args)`` validates builder arguments (:class:`GraphConfig`) and returns the bound
Serve application: Actors (one replica: creates and owns the scheduler, decode replica
and KV keeper actors, :class:`~br_serve.serve.actors.ActorOwner`) and, for local
engines, Prefill (N replicas) -> Ingress (``serve.ingress_replicas`` replicas, FastAPI),
which borrows the actors' handles. With remote engines (``engine=vllm|sglang``) there is
no Prefill deployment: each ingress replica calls the prefill servers itself
(:mod:`br_serve.serve.frontend.prefilling`).
``deploy(cfg)`` starts Serve's HTTP proxy on ``cfg.serve.host:cfg.serve.port`` and runs
the application (for the demo, tests and benchmarks; users run
``serve run graphs.balance_route:app``); behind Serve's HAProxy front
(``serve.front=haproxy``) it also waits for HAProxy's direct path to the ingress
(:mod:`br_serve.serve.front`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from br_serve.serve.config import GraphConfig, parse_graph_config

log = logging.getLogger(__name__)


def build(args: Mapping[str, Any] | GraphConfig | None = None) -> Any:
    """The Serve application for ``args`` (builder arguments, strings allowed).

    Raises:
        GraphConfigError: a bad argument, named in the message.
    """
    from ray import serve

    from br_serve.serve.actors import ActorOwner
    from br_serve.serve.frontend.ingress import Ingress
    from br_serve.serve.prefill.worker import PrefillWorker

    cfg = parse_graph_config(args)
    prefill: Any = None  # remote engines: each ingress replica calls the prefill servers
    if cfg.is_remote:
        cfg = check_remote_engines(cfg)
    else:
        prefill = serve.deployment(  # type: ignore[attr-defined]
            PrefillWorker, name="Prefill").options(
            num_replicas=cfg.prefill.replicas, ray_actor_options=cfg.replica_actor_options(),
            max_ongoing_requests=1000).bind(cfg)
    owner = serve.deployment(ActorOwner, name="Actors").options(  # type: ignore[attr-defined]
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
    ingress = serve.deployment(Ingress, name="Ingress").options(  # type: ignore[attr-defined]
        num_replicas=cfg.serve.ingress_replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10000)
    return ingress.bind(prefill, owner.bind(cfg), cfg)


def check_remote_engines(cfg: GraphConfig) -> GraphConfig:
    """``cfg`` with ``remote.model`` set to what the remote engines serve, after a
    bounded preflight (:mod:`br_serve.remote.preflight`): health, model, and the
    prefill answer's fit with ``remote.kv_handoff``.

    Raises:
        GraphConfigError: an engine cannot serve the graph (the message names it).
    """
    from br_serve.remote.preflight import PreflightError, preflight
    from br_serve.serve.config import GraphConfigError

    remote = cfg.remote
    try:
        found = preflight(cfg.engine.name, remote.prefill_urls, remote.decode_urls,
                          remote.model, remote.kv_handoff, remote.api_key,
                          timeout_s=remote.connect_s * 2,
                          probe_s=min(remote.first_token_s, PREFLIGHT_PROBE_S))
    except PreflightError as exc:
        raise GraphConfigError(str(exc)) from None
    return cfg.model_copy(update={"remote": remote.model_copy(update={"model": found.model})})


#: most seconds the preflight waits for one probe prefill (a cold CPU vLLM answers its
#: first request in a few seconds)
PREFLIGHT_PROBE_S = 30.0
#: how long ``deploy`` waits for HAProxy's direct path to the ingress (serve.front=haproxy)
FRONT_WAIT_S = 60.0


def deploy(cfg: GraphConfig, route_prefix: str = "/", blocking: bool = False) -> Any:
    """Start Serve (HTTP on ``cfg.serve.host:cfg.serve.port``) and run the app; returns its handle
    once the scheduler is ready (replicas found, barrier group formed)."""
    from ray import serve

    app = build(cfg)  # the remote preflight fails here, before Serve starts
    serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port})
    try:
        handle = serve.run(app, name=cfg.serve.app_name, route_prefix=route_prefix,
                           blocking=blocking)
    except RuntimeError as exc:
        # Serve's own message names only the failed deployments; the reason (e.g.
        # "remote.prefill_urls[0] ...: cannot reach the engine") is in their status
        why = failure_reasons(cfg.serve.app_name)
        if not why:
            raise
        raise RuntimeError(f"{exc} {why}") from exc
    # Wait until the scheduler has found the replicas and formed the barrier group.
    handle.state.remote().result(timeout_s=120)
    if cfg.serve.front == "haproxy":
        from br_serve.serve.front import wait_direct

        if not wait_direct(cfg.serve.app_name, FRONT_WAIT_S):
            log.warning("HAProxy has no ingress replica of %r up after %.0f s: new "
                        "connections go through Serve's Python proxy (its fallback) "
                        "until one is", cfg.serve.app_name, FRONT_WAIT_S)
    return handle


def failure_reasons(app_name: str) -> str:
    """The last line of each failed deployment's error in ``app_name`` ("" if none)."""
    from ray import serve

    try:
        app = serve.status().applications.get(app_name)
    except Exception:  # only an error message depends on it
        return ""
    if app is None:
        return ""
    reasons = []
    for name, dep in app.deployments.items():
        if str(dep.status).endswith("DEPLOY_FAILED") and dep.message:
            last = [ln for ln in dep.message.strip().splitlines() if ln.strip()][-1]
            reasons.append(f"{name}: {last.strip()}")
    return "; ".join(reasons)


#: The deployments that make an application a BalanceRoute graph (and Prefill, for
#: local engines).
GRAPH_DEPLOYMENTS = frozenset({"Ingress", "Actors"})


def pick_app(apps: Mapping[str, Any]) -> str:
    """The one BalanceRoute application among ``apps`` (name -> its deployment names).

    Raises:
        LookupError: none, or several (the message lists the candidates).
    """
    ours = sorted(n for n, deps in apps.items() if set(deps) >= GRAPH_DEPLOYMENTS)
    if len(ours) == 1:
        return ours[0]
    if not ours:
        raise LookupError(f"no BalanceRoute application is running (applications: "
                          f"{sorted(apps) or 'none'})")
    raise LookupError(f"several BalanceRoute applications are running ({ours}); "
                      "pass the name")


def get_handle(name: str | None = None) -> Any:
    """The handle of a running BalanceRoute app: ``name``, or the only one running.

    ``serve run graphs.balance_route:app`` without ``--name`` calls the app
    ``default``; this finds it either way. Call ``.options(stream=True)`` and then
    ``generate_stream.remote(prompt, max_tokens=...)`` to stream tokens.

    Raises:
        LookupError: no name given and not exactly one BalanceRoute app is running.
    """
    from ray import serve

    if name is None:
        status = serve.status()
        name = pick_app({n: list(a.deployments) for n, a in status.applications.items()})
    return serve.get_app_handle(name)
