"""``br-serve`` subcommands of the serving graph: ``serve`` and ``demo`` (the benchmarks
of the graph are in :mod:`br_serve.bench.cli`).

Graph options are passed as ``--set key=value`` (any :class:`GraphConfig` field by its
path, ``serve.port`` or ``serve_port``: the same names as the ``serve run ... key=value``
builder arguments); a bad one exits 2 with a message naming it. Ray and the graph are
imported inside the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from br_serve.serve.config import GraphConfig, GraphConfigError, parse_graph_config


def kv_args(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items:
        key, sep, val = it.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected key=value (got {it!r})")
        out[key] = val
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_given(given: Mapping[str, str]) -> bool:
    """Whether the ``--set`` arguments name ``serve.port`` (in any spelling)."""
    from br_serve.serve.config import field_path

    return any(field_path(k) == ("serve", "port") for k in given)


def on_free_port(base: GraphConfig) -> GraphConfig:
    """``base`` with its Serve front door on a local port that is free now. Call it
    after :func:`start_ray`: Ray's processes bind ephemeral ports of their own as they
    start, and a port picked before them can be taken by one (a raylet once held the
    bench's Serve port; HAProxy could not bind it and every graph request of an
    hour-long bench failed)."""
    return parse_graph_config(base, serve_port=free_port())


#: the environment switch of Serve's HAProxy ingress (read by Ray's processes at start)
HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"


def start_ray(num_cpus: int | None, front: str = "proxy") -> None:
    """A local Ray for ``br-serve``'s own launchers, with ``front`` (``serve.front``) as
    Serve's HTTP front door: Ray's processes take it from this process's environment.

    Raises:
        GraphConfigError: ``front`` is ``proxy`` but the environment asks Ray for the
            HAProxy front (``RAY_SERVE_ENABLE_HA_PROXY=1``): one of the two would be
            ignored.
    """
    # Local single-user clusters: Ray's token auth would need a token per client.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if front == "haproxy":
        os.environ[HAPROXY_ENV] = "1"
    elif os.environ.get(HAPROXY_ENV, "0") != "0":
        raise GraphConfigError(
            f"serve.front: is {front!r} but {HAPROXY_ENV}={os.environ[HAPROXY_ENV]} is set "
            "in the environment, which starts Serve's HAProxy front door; set "
            f"serve.front=haproxy, or unset {HAPROXY_ENV}")
    import ray

    ray.init(include_dashboard=False, num_cpus=num_cpus,
             object_store_memory=512 * 1024**2, log_to_driver=False)


def stop_ray() -> None:
    import ray
    from ray import serve

    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def cmd_serve(args: argparse.Namespace) -> int:
    """Deploy on a local Ray and serve until interrupted (``serve run`` equivalent)."""
    cfg = parse_graph_config(kv_args(args.set))
    from br_serve.serve.graph import deploy

    start_ray(args.num_cpus, cfg.serve.front)
    try:
        deploy(cfg)
        print(f"serving {cfg.serve.model!r} on http://{cfg.serve.host}:{cfg.serve.port}/v1 "
              f"(G={cfg.replicas}, policy={cfg.policy.name}); Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    finally:
        stop_ray()


async def _demo_requests(cfg: GraphConfig, n: int, max_tokens: int) -> list[dict[str, Any]]:
    import asyncio

    import httpx

    headers = {}
    key = cfg.resolved_api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with httpx.AsyncClient(base_url=f"http://{cfg.serve.host}:{cfg.serve.port}",
                                 timeout=120,
                                 headers=headers) as c:
        async def one(i: int) -> dict[str, Any]:
            prompt = " ".join(["word"] * (20 + 97 * i))
            t0 = time.perf_counter()
            r = await c.post("/v1/completions", json={
                "model": cfg.serve.model, "prompt": prompt, "max_tokens": max_tokens, "seed": i})
            body = r.json()
            return {"status": r.status_code, "latency_s": round(time.perf_counter() - t0, 3),
                    "usage": body.get("usage"),
                    "text": body["choices"][0]["text"][:40] if r.status_code == 200 else body}

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def cmd_demo(args: argparse.Namespace) -> int:
    """Start local Ray, deploy the default graph, send requests, print, shut down."""
    import asyncio

    given = kv_args(args.set)
    cfg = parse_graph_config(given)
    from br_serve.serve.graph import deploy

    start_ray(args.num_cpus, cfg.serve.front)
    if not port_given(given):
        cfg = on_free_port(cfg)  # after Ray's own processes took their ports
    try:
        t0 = time.perf_counter()
        deploy(cfg)
        print(f"deployed G={cfg.replicas} policy={cfg.policy.name} on "
              f"http://{cfg.serve.host}:{cfg.serve.port} in {time.perf_counter() - t0:.1f}s",
              flush=True)
        results = asyncio.run(_demo_requests(cfg, args.requests, args.max_tokens))
        for i, r in enumerate(results):
            print(f"request {i}: {json.dumps(r)}")
        import httpx

        key = cfg.resolved_api_key()
        hdr = {"Authorization": f"Bearer {key}"} if key else {}
        state = httpx.get(f"http://{cfg.serve.host}:{cfg.serve.port}/v1/br/state",
                          headers=hdr).json()
        print("state:", json.dumps(state))
        ok = all(r["status"] == 200 and r["usage"]["completion_tokens"] == args.max_tokens
                 for r in results)
        print("demo:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        stop_ray()


def common_arguments() -> argparse.ArgumentParser:
    """``--set KEY=VALUE`` and ``--num-cpus``, shared by every graph command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="graph option by its path (serve.port, step.b_s, policy, "
                        "policy.options.r_max, ...; or with _ for the dots), repeatable")
    common.add_argument("--num-cpus", type=int, default=None,
                        help="CPUs for the local Ray (default: all)")
    return common


def register(sub: Any) -> None:
    common = common_arguments()

    p = sub.add_parser("serve", parents=[common], help="serve the graph on a local Ray")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", parents=[common],
                       help="deploy locally, send a few requests, print, exit")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.set_defaults(func=cmd_demo)


if __name__ == "__main__":  # pragma: no cover
    from br_serve.cli import main

    sys.exit(main())
