"""The BalanceRoute serving graph, for ``serve run`` / ``serve deploy``.

    serve run graphs.balance_route:app                          # G=4, br0, emulated
    serve run graphs.balance_route:build replicas=8 policy=brh
    serve run graphs/balance_route.yaml                         # the example config

Python callers stream through ``br_serve.serve.graph.get_handle()``, which finds the
running graph under any application name (``serve run`` names it ``default``).

Defaults: local Ray, emulated engine, 4 decode replicas, 2 prefill replicas, policy
``br0``, HTTP on 127.0.0.1:8000 (Serve's own default; ``serve run`` flags or the YAML's
``http_options`` change it). Every builder argument is a field of
:class:`br_serve.serve.config.GraphConfig`; a bad one fails with a message naming it.
"""

from __future__ import annotations

from typing import Any

from br_serve.serve.graph import build as _build


def build(args: dict[str, Any]) -> Any:
    """Application builder: ``serve run graphs.balance_route:build key=value ...``."""
    return _build(args)


app = _build({})
