"""CPU cost of proxying one remote DP rank (``RemoteDecodeEngine``), without Ray.

Starts a vLLM decode emulator (and its prefill twin) in subprocesses, opens ``--streams``
decode streams pinned to rank 0 through one :class:`RemoteDecodeEngine` in this
process, and drives ``step()`` in a loop as a decode replica's step thread does. Prints
(and writes as JSON) this process's CPU seconds per engine step, per stream-token, and
the emulator's own CPU per step, side by side.

    python benchmarks/remote_proxy_cost.py --streams 16 --tokens 200 --step-b-s 0.03

``--httpx`` measures instead the CPU per chunk of consuming the same streams with
httpx alone (no parsing): why the proxy reads streams with its own protocol client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx

from br_serve.bench.remote_engines import REMOTE_MODEL, emulated_engines, engine_counters
from br_serve.engine.base import SamplingParams
from br_serve.engine.remote import RemoteDecodeEngine
from br_serve.remote.client import RemoteEngineClient
from br_serve.remote.ticket import RemoteTicket, completion_body
from br_serve.serve.config import parse_graph_config


async def _prefill(url: str, n: int, tokens: int) -> list[RemoteTicket]:
    async with RemoteEngineClient() as c:
        out = []
        for i in range(n):
            body = completion_body("w " * 50, SamplingParams(max_tokens=tokens, seed=i),
                                   REMOTE_MODEL)
            res = await c.vllm_prefill(url, body, f"r{i}")
            assert res.kv_transfer_params is not None
            out.append(RemoteTicket("vllm", url, f"r{i}", body, res.prompt_tokens,
                                    kv_transfer_params=res.kv_transfer_params))
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--step-b-s", type=float, default=0.03)
    ap.add_argument("--httpx", action="store_true",
                    help="measure bare httpx stream consumption instead of the proxy")
    ap.add_argument("--out", default="results/control-plane/remote_proxy_cost.json")
    args = ap.parse_args()
    cfg = parse_graph_config(replicas=1, step_b_s=args.step_b_s, step_a_s_per_token=0.0,
                             slots=max(args.streams, 1))
    with emulated_engines(cfg, "vllm") as (remote, durl):
        tickets = asyncio.run(_prefill(remote.remote.prefill_urls[0], args.streams,
                                       args.tokens))
        if args.httpx:
            return _httpx(durl, tickets, args)
        eng = RemoteDecodeEngine(durl, 0)
        e0 = engine_counters(durl)
        c0, w0 = time.process_time(), time.perf_counter()
        for t in tickets:
            eng.admit(t.request_id, t, t.prompt_tokens, -1, SamplingParams())
        steps = tokens = 0
        while eng.running():
            evs = eng.step()
            steps += 1
            tokens += len(evs)
            assert not eng.take_failures()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        e1 = engine_counters(durl)
        eng.close()
        with httpx.Client() as h:
            assert h.get(f"{durl}/health").status_code == 200
    n = e1["steps"] - e0["steps"]
    res = {"config": vars(args), "proxy_steps": steps, "engine_steps": n, "tokens": tokens,
           "proxy_cpu_ms_per_engine_step": cpu / n * 1e3,
           "proxy_cpu_us_per_token": cpu / tokens * 1e6,
           "engine_cpu_ms_per_step": (e1["process_cpu_s"] - e0["process_cpu_s"]) / n * 1e3,
           "wall_ms_per_engine_step": wall / n * 1e3}
    print(json.dumps(res, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


def _httpx(durl: str, tickets: list[RemoteTicket], args: argparse.Namespace) -> int:
    async def one(client: httpx.AsyncClient, t: RemoteTicket) -> int:
        body, headers = t.decode_call(t.request_id, 0)
        n = 0
        async with client.stream("POST", durl + "/v1/completions", json=body,
                                 headers=headers) as r:
            async for _ in r.aiter_raw():
                n += 1
        return n

    async def all_streams() -> int:
        limits = httpx.Limits(max_connections=1000)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return sum(await asyncio.gather(*(one(client, t) for t in tickets)))

    c0 = time.process_time()
    chunks = asyncio.run(all_streams())
    cpu = time.process_time() - c0
    res = {"config": vars(args), "httpx_chunks": chunks,
           "httpx_cpu_us_per_chunk": cpu / chunks * 1e6}
    print(json.dumps(res, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
