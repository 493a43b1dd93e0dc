"""The step barrier over real gloo process groups (three processes, no Ray): every rank
gets every row each step, in lock-step, and a dead peer fails the step within the
timeout instead of hanging it."""

from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import time
from typing import Any

import pytest

from br_serve.serve.replica.barrier import Barrier, BarrierError, open_store

pytestmark = pytest.mark.timeout(120)
WORLD = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, steps: int, die_after: int | None, q: Any,
          timeout_s: float) -> None:
    b = Barrier("gloo", "127.0.0.1", port, rank, (0, 1, 2), 1, timeout_s=timeout_s,
                join_timeout_s=30)
    seen = []
    try:
        for step in range(steps):
            if die_after is not None and step == die_after:
                return  # this rank "dies": it leaves without exchanging
            rows = b.exchange(100 * rank + step, rank, int(rank == 1), 0.25 * rank + step)
            seen.append(rows.tolist())
        q.put((rank, "ok", seen))
    except BarrierError as exc:
        q.put((rank, "error", str(exc)))


def _context() -> Any:
    """Processes forked from a fork server, not from this process: pytest's process
    runs threads (torch's, the Ray modules' before this one), and a child forked while
    one of them holds a lock can hang for good (seen in CI: a rank stuck in
    ``TCPStore`` forever, and the run with it). The server is a fresh single-threaded
    process that imports torch once; its forks are cheap and safe."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "br_serve.serve.replica.barrier"])
    return ctx


def _run(steps: int, die: dict[int, int], timeout_s: float) -> dict[int, tuple[str, Any]]:
    ctx = _context()
    q = ctx.Queue()
    store, port = open_store("127.0.0.1", 1, 30)  # rank 0's store, hosted here
    procs = [ctx.Process(target=_rank, args=(r, port, steps, die.get(r), q, timeout_s))
             for r in range(WORLD)]
    out: dict[int, tuple[str, Any]] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 90
        while len(out) < WORLD - len(die):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, data = q.get(timeout=left)
            except queue.Empty:
                break
            out[rank] = (status, data)
    finally:
        for p in procs:  # never leave a stuck rank behind: it would hold the test run
            if p.pid is None:
                continue  # never started
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        del store
    return out


def test_rows_reach_every_rank_and_a_dead_peer_fails_the_others() -> None:
    out = _run(4, {}, timeout_s=20)  # generous: a loaded CI host must not time out
    for rank in range(WORLD):
        status, seen = out[rank]
        assert status == "ok"
        assert seen == [[[100 * r + s, r, int(r == 1), 0.25 * r + s] for r in range(WORLD)]
                        for s in range(4)]
    t0 = time.monotonic()
    out = _run(4, {2: 2}, timeout_s=2)  # rank 2 leaves at step 2
    assert {r: s for r, (s, _) in out.items()} == {0: "error", 1: "error"}
    assert time.monotonic() - t0 < 30  # within the op timeout (2 s), not a hang
