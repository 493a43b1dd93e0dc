"""The BalanceRoute serving graph, for ``serve run`` / ``serve deploy``.

    serve run graphs.balance_route:app                          # G=4, br0, emulated
    serve run graphs.balance_route:build replicas=8 policy=brh
    serve run graphs/balance_route.yaml                         # the example config

Python callers stream through ``br_serve.serve.graph.get_handle()``, which finds the
running graph under any application name (``serve run`` names it ``default``).

Defaults: local Ray, emulated engine, 4 decode replicas, 2 prefill replicas, policy
``br0``, HTTP on 127.0.0.1:8000 (Serve's own default). Every builder argument is a field
of :class:`br_serve.serve.config.GraphConfig` by its path (``step.b_s`` or ``step_b_s``;
``policy=brh`` sets ``policy.name``); a bad one fails with a message naming it.
``serve.host`` and ``serve.port`` are refused here: Serve's HTTP proxy is one per
cluster and ``serve run`` starts it before it calls this builder, so they would be
ignored (see :data:`HTTP_ARGS_MESSAGE` for what to use instead). ``serve.front`` is
refused too: the front door is fixed when Ray starts (:data:`FRONT_MESSAGE`).
"""

from __future__ import annotations

from typing import Any

from br_serve.serve.config import GraphConfigError, field_path
from br_serve.serve.graph import build as _build

HTTP_ARGS_MESSAGE = (
    "cannot be a builder argument: Serve's HTTP proxy is shared by the whole cluster and "
    "is started before the application is built, so it would be ignored. Set it where "
    "Serve starts: http_options in a Serve config file (serve run graphs/balance_route."
    "yaml), or `serve start --http-host H --http-port P` before `serve run`, or "
    "`br-serve serve --set serve.host=H --set serve.port=P`")

FRONT_MESSAGE = (
    "cannot be a builder argument: the HTTP front door is fixed when Ray starts. For "
    "Serve's HAProxy ingress set RAY_SERVE_ENABLE_HA_PROXY=1 in the environment of "
    "`ray start` (or of `serve run` when it starts a local Ray), or use "
    "`br-serve serve --set serve.front=haproxy`")


def build(args: dict[str, Any]) -> Any:
    """Application builder: ``serve run graphs.balance_route:build key=value ...``.

    Raises:
        GraphConfigError: a bad argument, or ``serve.host`` / ``serve.port`` (also as
            ``host`` / ``port``) or ``serve.front`` (also as ``front``; named).
    """
    for key, value in args.items():
        path = field_path(key)
        inner = tuple(value) if path == ("serve",) and isinstance(value, dict) else ()
        if key in ("host", "port"):  # what one types for an HTTP address
            raise GraphConfigError(f"{key}: {HTTP_ARGS_MESSAGE}")
        for sub in ("host", "port"):
            if path == ("serve", sub) or sub in inner:
                raise GraphConfigError(f"serve.{sub}: {HTTP_ARGS_MESSAGE}")
        if key == "front" or path == ("serve", "front") or "front" in inner:
            raise GraphConfigError(f"serve.front: {FRONT_MESSAGE}")
    return _build(args)


app = _build({})
