"""What one message between two actors costs: a Ray actor call against a frame on the
event channel (``br_serve.serve.wire.channel``), CPU on each side, on one local Ray.

    python benchmarks/rpc_cost.py --calls 2000 --out results/control-plane/rpc_cost.json

A Ray call here is the ingress's poll of a decode replica as it was (an async actor
method answering 16 token tuples, awaited by another async actor) and the report a
decode replica sent per step (a fire-and-forget call with one ``ReplicaReport``). The
channel case writes the same 16 tokens as one frame to a socket read by another actor.
CPU is each process's ``time.process_time()`` (all its threads) over the calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EV = [(f"req-{i:04d}-abcdefabcdef", 1234, "tok", 17, False, None) for i in range(16)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default="results/control-plane/rpc_cost.json")
    args = p.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from br_serve.serve.wire.channel import (
        ChannelServer,
        decode_events,
        encode_events,
        encode_report,
    )
    from br_serve.serve.wire.messages import ReplicaReport

    ray.init(include_dashboard=False, num_cpus=2, object_store_memory=100 * 2**20,
             log_to_driver=False)

    rep = ReplicaReport(replica=0, generation=1, step=5, load_tokens=8000,
                        running_ids=(), prompt_tokens=(), decoded_tokens=(),
                        finished_ids=(), finished_output_tokens=(), members=tuple(range(8)),
                        barrier_loads=(8000,) * 8, barrier_running=(16,) * 8,
                        compute_s=0.002, barrier_s=0.001, incarnation="abc",
                        barrier_step=5, full=False, barrier_flags=(1,) * 8)

    @ray.remote(num_cpus=0)
    class Server:
        def __init__(self) -> None:
            self.frames = 0
            self.server: Any = None

        async def poll(self, owner: str, timeout_s: float = 1.0) -> list[Any]:
            return EV

        async def report(self, r: Any) -> None:
            self.frames += 1

        async def listen(self) -> tuple[str, int, str]:
            async def ready(g: int, k: int, conn: object) -> bool:
                return True

            def got(g: int, conn: object, evs: list[Any]) -> None:
                self.frames += 1

            self.server = ChannelServer("127.0.0.1", ready, got, lambda g, c: None,
                                        decode=decode_events)
            spec: tuple[str, int, str] = await self.server.start()
            return spec

        async def stats(self) -> tuple[float, int]:
            return time.process_time(), self.frames

    @ray.remote(num_cpus=0)
    class Client:
        async def polls(self, srv: Any, n: int) -> float:
            c0 = time.process_time()
            for _ in range(n):
                await srv.poll.remote("o")
            return time.process_time() - c0

        def reports(self, srv: Any, n: int, r: Any) -> float:
            c0 = time.process_time()
            for _ in range(n):
                srv.report.remote(r)
            return time.process_time() - c0

        async def frames(self, spec: tuple[str, int, str], n: int) -> float:
            from br_serve.serve.wire.channel import MAGIC, frame

            _, w = await asyncio.open_connection(spec[0], spec[1])
            w.write(frame((MAGIC, spec[2], 0, "inc", 0)))
            c0 = time.process_time()
            for _ in range(n):
                w.write(encode_events(EV))  # type: ignore[arg-type]
                await w.drain()
                await asyncio.sleep(0)
            out = time.process_time() - c0
            await asyncio.sleep(0.5)
            w.close()
            return out

        def report_frames(self, n: int, r: Any) -> float:
            c0 = time.process_time()
            for _ in range(n):
                encode_report(r)
            return time.process_time() - c0

    srv, cli = Server.remote(), Client.remote()  # type: ignore[attr-defined]
    spec = ray.get(srv.listen.remote())
    n = args.calls
    rows = []
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("ray poll (16 tokens, awaited)", lambda: cli.polls.remote(srv, n)),
        ("ray report (fire-and-forget)", lambda: cli.reports.remote(srv, n, rep)),
        ("channel frame (16 tokens)", lambda: cli.frames.remote(spec, n))]
    for name, call in cases:
        ray.get(call())  # warm
        s0, f0 = ray.get(srv.stats.remote())
        client_s = ray.get(call())
        time.sleep(1.0)  # fire-and-forget calls still arriving
        s1, f1 = ray.get(srv.stats.remote())
        rows.append({"message": name, "calls": n,
                     "client_cpu_us": round(client_s / n * 1e6, 1),
                     "server_cpu_us": round((s1 - s0) / n * 1e6, 1),
                     "received": f1 - f0})
    enc = ray.get(cli.report_frames.remote(n, rep))
    rows.append({"message": "report frame encode only", "calls": n,
                 "client_cpu_us": round(enc / n * 1e6, 1), "server_cpu_us": None,
                 "received": None})
    out = {"config": {"calls": n, "host": platform.node(), "cpus": os.cpu_count(),
                      "ray": ray.__version__},
           "rows": rows, "load_average": list(os.getloadavg())}
    print("| message | client CPU us | server CPU us |\n|---|---|---|")
    for r in rows:
        print(f"| {r['message']} | {r['client_cpu_us']} | {r['server_cpu_us']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
