"""Requests lost on pooled connections the server is closing at its keep-alive bound.

An engine's API server (uvicorn) closes a connection idle for 5 s. A client whose pool
keeps idle connections for as long (httpx's default ``keepalive_expiry`` of 5 s) sends
some requests, after about 5 s of idleness, on a connection the server is closing at
that moment: the request is lost unanswered (``ReadError``), and the server never saw
it. This script measures how many, side by side in one run, for a client pool with
the default expiry and one with the project's ``Timeouts.keepalive_s``.

Each round: both clients send a burst of ``--burst`` concurrent requests (filling their
pools), wait ``gap`` seconds, and send a second burst, whose failures are counted. The
gaps sweep the server's bound.

The server runs in a process of its own. ``--server-gil-hogs`` threads of pure-Python
work in that process delay its event loop, as a loaded host does (in the tests the
emulator runs as a thread of the process that also drives Ray); ``--cpu-hogs`` busy
processes load the host. A late loop closes every connection whose timer expired,
requests that arrived meanwhile included, which widens the window.

    python -m research.keepalive_race --rounds 24 --server-gil-hogs 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from br_serve.remote.client import RemoteEngineClient, Timeouts
from br_serve.remote.errors import RemoteEngineError

SERVER_KEEPALIVE_S = 5.0  # uvicorn's default, kept by vLLM's and SGLang's servers


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> dict[str, Any]:
        await asyncio.sleep(0.005)
        return {"ok": True}

    return app


def _hog(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for _ in range(10_000):
            x += 1


async def _burst(c: RemoteEngineClient, url: str, n: int, verbose: bool = False) -> int:
    res = await asyncio.gather(*(c.request_json("POST", url, {}) for _ in range(n)),
                               return_exceptions=True)
    for r in res:
        if isinstance(r, BaseException) and not isinstance(r, RemoteEngineError):
            raise r
    bad = [r for r in res if isinstance(r, RemoteEngineError)]
    if bad and verbose:
        print("   ", sorted({type(b).__name__ + ": " + str(b)[:80] for b in bad}))
    return len(bad)


def _serve(port: int, gil_hogs: int, seconds: float) -> None:
    for _ in range(gil_hogs):
        threading.Thread(target=_hog, args=(seconds,), daemon=True).start()
    uvicorn.run(_app(), host="127.0.0.1", port=port, log_level="error", access_log=False,
                timeout_keep_alive=int(SERVER_KEEPALIVE_S))


async def _wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the server on port {port} did not start")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    await _wait_listening(args.port)
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    expiries = {"httpx default (5 s)": SERVER_KEEPALIVE_S, "project (keepalive_s)":
                Timeouts().keepalive_s}
    clients = {k: RemoteEngineClient(Timeouts(keepalive_s=v)) for k, v in expiries.items()}
    lost = {k: 0 for k in clients}
    sent = 0
    gaps = [args.gap_lo + (args.gap_hi - args.gap_lo) * i / max(args.rounds - 1, 1)
            for i in range(args.rounds)]
    for i, gap in enumerate(gaps):
        await asyncio.gather(*(_burst(c, url, args.burst) for c in clients.values()))
        await asyncio.sleep(gap)
        got = await asyncio.gather(*(_burst(c, url, args.burst, True) for c in clients.values()))
        sent += args.burst
        for k, n in zip(clients, got, strict=True):
            lost[k] += n
        print(f"round {i + 1}/{len(gaps)} gap {gap:.3f} s: lost "
              + ", ".join(f"{k} {n}" for k, n in zip(clients, got, strict=True)), flush=True)
    for c in clients.values():
        await c.aclose()
    return {"config": {"rounds": args.rounds, "burst": args.burst, "gap_s": [args.gap_lo,
                       args.gap_hi], "cpu_hogs": args.cpu_hogs,
                       "server_gil_hogs": args.server_gil_hogs,
                       "server_keepalive_s": SERVER_KEEPALIVE_S, "expiry_s": expiries},
            "sent_per_client": sent, "lost": lost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--burst", type=int, default=60)
    ap.add_argument("--gap-lo", type=float, default=4.90)
    ap.add_argument("--gap-hi", type=float, default=5.05)
    ap.add_argument("--cpu-hogs", type=int, default=0)
    ap.add_argument("--server-gil-hogs", type=int, default=0)
    ap.add_argument("--port", type=int, default=28790)
    ap.add_argument("--out", default="results/keepalive_race.json")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    life_s = args.rounds * 15.0
    hogs = [ctx.Process(target=_hog, args=(life_s,), daemon=True)
            for _ in range(args.cpu_hogs)]
    hogs.append(ctx.Process(target=_serve, args=(args.port, args.server_gil_hogs, life_s),
                            daemon=True))
    for h in hogs:
        h.start()
    t0 = time.monotonic()
    try:
        out = asyncio.run(run(args))
    finally:
        for h in hogs:
            h.terminate()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
