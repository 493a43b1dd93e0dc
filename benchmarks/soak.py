"""Soak the live graph: steady load, 3x-capacity bursts, client disconnects and random
actor kills for N minutes, then check that nothing leaked, hung or went wrong.

    python benchmarks/soak.py --minutes 5 --out results/serve/soak.json

Bounded in time (``--minutes`` of load, then at most ``--drain-s`` to settle) and in
count (``--max-requests``); HTTP on 127.0.0.1 only; a local Ray it starts and stops.

Load: Poisson arrivals at ``--rate`` requests/s; every ``--burst-every-s`` a burst of
``3 x capacity`` requests at once (capacity = G x slots + pool); a ``--disconnect``
share of clients hang up after a few tokens. Faults: every ``--kill-every-s`` (jittered)
one of: a decode replica, the scheduler, a prefill replica, the KV keeper, both a decode
replica and the scheduler, or (``--ingress-kills``) the ingress replica.

Each request ends as one of: ``ok`` (exactly ``max_tokens`` tokens, each the emulated
engine's), ``429`` (refused, with Retry-After), ``503``, ``error`` (an explicit error
event after a correct prefix, or a 5xx), ``disconnected`` (by us, after a correct
prefix), ``broken`` (the connection broke: only around an ingress kill), ``hung`` (no
end within ``--stream-timeout-s``) or ``bad`` (a wrong, duplicated or missing token).

Checks (exit 1 if any fails): 0 hung, 0 bad, 0 broken outside the seconds after an
ingress kill, every request answered, and after the load stops the graph recovers (all
G members back) and, once idle, holds 0 slots (every replica 0 running, all slots
free, empty pool, nothing in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MODEL = "br-emulated"
NS = "br_serve"


@dataclass
class Outcome:
    kind: str
    tokens: int = 0
    detail: str = ""


@dataclass
class Soak:
    args: argparse.Namespace
    app: str = "soak"
    outcomes: list[Outcome] = field(default_factory=list)
    kills: list[tuple[float, str]] = field(default_factory=list)
    ingress_kills: list[float] = field(default_factory=list)
    t0: float = 0.0
    launched: int = 0

    @property
    def capacity(self) -> int:
        a = self.args
        return int(a.replicas * a.slots + a.pool)

    # -- one request ----------------------------------------------------------------
    async def request(self, client: Any, i: int, rng: random.Random) -> None:
        from br_serve.engine.emulated import token_id, token_text

        prompt = rng.randint(2, 40)
        max_tokens = rng.randint(2, self.args.max_tokens)
        seed = 1_000_000 + i
        expected = [token_text(token_id(seed, prompt + k)) for k in range(max_tokens)]
        cut = rng.randint(1, max_tokens) if rng.random() < self.args.disconnect else None
        payload = {"model": MODEL, "prompt": " ".join(["w"] * prompt),
                   "max_tokens": max_tokens, "seed": seed, "stream": True}
        got: list[str] = []
        self.launched += 1
        try:
            out = await asyncio.wait_for(self._stream(client, payload, got, expected, cut),
                                         self.args.stream_timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            out = Outcome("hung", len(got))
        self.outcomes.append(out)

    async def _stream(self, client: Any, payload: dict[str, Any], got: list[str],
                      expected: list[str], cut: int | None) -> Outcome:
        import httpx

        error = None
        try:
            async with client.stream("POST", "/v1/completions", json=payload) as r:
                if r.status_code != 200:
                    body = (await r.aread()).decode(errors="replace")[:200]
                    if r.status_code == 429 and not r.headers.get("retry-after"):
                        return Outcome("bad", 0, f"429 without Retry-After: {body}")
                    kind = str(r.status_code) if r.status_code in (429, 503) else "error"
                    return Outcome(kind, 0, body)
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        error = ev["error"]["message"]
                        continue
                    for ch in ev.get("choices", []):
                        if ch.get("text"):
                            got.append(ch["text"])
                    if got != expected[: len(got)]:
                        return Outcome("bad", len(got), "wrong token")
                    if cut is not None and len(got) >= cut:
                        return Outcome("disconnected", len(got))
        except (httpx.HTTPError, ValueError) as exc:
            return Outcome("broken", len(got), f"{type(exc).__name__}: {exc}"[:200])
        if error is not None:
            return Outcome("error", len(got), error[:200])
        if got != expected:
            return Outcome("bad", len(got), f"{len(got)} of {len(expected)} tokens")
        return Outcome("ok", len(got))

    # -- load and faults ------------------------------------------------------------
    async def load(self, port: int) -> None:
        import httpx

        rng = random.Random(self.args.seed)
        limits = httpx.Limits(max_connections=4000, max_keepalive_connections=500)
        end = self.t0 + self.args.minutes * 60
        tasks: list[asyncio.Task[None]] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                     timeout=self.args.stream_timeout_s) as client:
            i = 0
            next_burst = self.t0 + self.args.burst_every_s
            while time.monotonic() < end and i < self.args.max_requests:
                n = 1
                if time.monotonic() >= next_burst:
                    n = 3 * self.capacity
                    next_burst += self.args.burst_every_s
                for _ in range(min(n, self.args.max_requests - i)):
                    tasks.append(asyncio.ensure_future(self.request(client, i, rng)))
                    i += 1
                await asyncio.sleep(rng.expovariate(self.args.rate))
            await asyncio.gather(*tasks)

    async def faults(self) -> None:
        import ray

        rng = random.Random(self.args.seed + 1)
        kinds = ["decode", "scheduler", "prefill", "keeper", "decode+scheduler"]
        if self.args.ingress_kills:
            kinds.append("ingress")
        end = self.t0 + self.args.minutes * 60 - self.args.kill_every_s / 2
        while True:
            await asyncio.sleep(self.args.kill_every_s * rng.uniform(0.5, 1.5))
            if time.monotonic() > end:
                return
            kind = rng.choice(kinds)
            g = rng.randrange(self.args.replicas)
            try:
                if kind in ("decode", "decode+scheduler"):
                    ray.kill(ray.get_actor(f"{self.app}:decode:{g}", namespace=NS),
                             no_restart=True)
                if kind in ("scheduler", "decode+scheduler"):
                    ray.kill(ray.get_actor(f"{self.app}:scheduler", namespace=NS),
                             no_restart=False)
                if kind == "keeper":
                    ray.kill(ray.get_actor(f"{self.app}:kv", namespace=NS), no_restart=False)
                if kind in ("prefill", "ingress"):
                    dep = "Prefill" if kind == "prefill" else "Ingress"
                    ray.kill(_serve_replica(self.app, dep), no_restart=False)
                    if kind == "ingress":
                        self.ingress_kills.append(time.monotonic() - self.t0)
            except ValueError as exc:  # not there right now (being replaced)
                kind = f"{kind} (skipped: {exc})"
            self.kills.append((round(time.monotonic() - self.t0, 1), kind))
            print(f"[{time.monotonic() - self.t0:6.1f}s] kill {kind}", flush=True)


def _serve_replica(app: str, deployment: str) -> Any:
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"SERVE_REPLICA::{app}#{deployment}#")]
    if not names:
        raise ValueError(f"no {deployment} replica")
    return ray.get_actor(names[0], namespace="serve")


def _settle(port: int, g: int, slots: int, timeout_s: float) -> dict[str, Any]:
    """Wait for all members back and an idle graph; returns the last state and its leak
    count (slots held, pool entries, in-flight entries)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            st = httpx.get(f"http://127.0.0.1:{port}/v1/br/state", timeout=10).json()
            members_ok = st["members"] == list(range(g))
            held = sum(r["running"] + slots - r["free_slots"] for r in st["replicas"])
            if members_ok and held == 0 and st["pool_size"] == 0 and st["in_flight"] == 0:
                break
        time.sleep(1.0)
    held = sum(r["running"] + slots - r["free_slots"] for r in st.get("replicas", []))
    return {"state": st, "members_back": st.get("members") == list(range(g)),
            "leaked_slots": held, "pool_left": st.get("pool_size", -1),
            "in_flight_left": st.get("in_flight", -1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--pool", type=int, default=32)
    p.add_argument("--rate", type=float, default=8.0, help="steady arrivals per second")
    p.add_argument("--max-tokens", type=int, default=60)
    p.add_argument("--burst-every-s", type=float, default=45.0)
    p.add_argument("--disconnect", type=float, default=0.2, help="share of clients")
    p.add_argument("--kill-every-s", type=float, default=25.0)
    p.add_argument("--ingress-kills", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--stream-timeout-s", type=float, default=240.0)
    p.add_argument("--max-requests", type=int, default=20000)
    p.add_argument("--drain-s", type=float, default=180.0)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/serve/soak.json")
    args = p.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, single-user cluster
    import ray
    from ray import serve

    from br_serve.serve.cli import free_port
    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    soak = Soak(args)
    ray.init(include_dashboard=False, num_cpus=args.num_cpus,
             object_store_memory=400 * 1024**2, log_to_driver=False)
    port = free_port()  # after Ray's own processes took their random ports
    cfg = parse_graph_config(serve_app_name=soak.app, replicas=args.replicas,
                             slots=args.slots, pool_capacity=args.pool, prefill_replicas=2,
                             serve_port=port, step_b_s=0.02, prefill_p0_s=0.01,
                             serve_barrier_timeout_s=3, serve_host="127.0.0.1")
    try:
        t_deploy = time.monotonic()
        deploy(cfg)
        print(f"deployed in {time.monotonic() - t_deploy:.1f} s; capacity {soak.capacity}; "
              f"soaking {args.minutes} min", flush=True)
        soak.t0 = time.monotonic()

        async def run() -> None:
            await asyncio.gather(soak.load(port), soak.faults())

        asyncio.run(run())
        load_s = time.monotonic() - soak.t0
        settle = _settle(port, args.replicas, args.slots, args.drain_s)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()

    counts = collections.Counter(o.kind for o in soak.outcomes)
    bad = [asdict(o) for o in soak.outcomes if o.kind in ("bad", "hung")][:10]
    broken = [o for o in soak.outcomes if o.kind == "broken"]
    checks = {
        "no_hung_streams": counts["hung"] == 0,
        "no_wrong_duplicated_or_missing_tokens": counts["bad"] == 0,
        "broken_only_around_ingress_kills": not broken or bool(soak.ingress_kills),
        "every_request_answered": soak.launched == len(soak.outcomes)
                                  and counts["hung"] == 0,
        "members_back": settle["members_back"],
        "no_leaked_slots": settle["leaked_slots"] == 0 and settle["pool_left"] == 0
                           and settle["in_flight_left"] == 0,
    }
    report = {
        "config": vars(args), "capacity": soak.capacity, "load_s": round(load_s, 1),
        "requests": len(soak.outcomes), "outcomes": dict(counts),
        "tokens_ok": sum(o.tokens for o in soak.outcomes if o.kind == "ok"),
        "kills": soak.kills, "settle": {k: v for k, v in settle.items() if k != "state"},
        "checks": checks, "examples_bad_or_hung": bad,
        "examples_error": sorted({o.detail for o in soak.outcomes
                                  if o.kind == "error"})[:8],
        "load_average": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("requests", "outcomes", "checks", "settle")},
                     indent=2))
    print(f"wrote {args.out}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
