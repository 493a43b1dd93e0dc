"""The step barrier over real gloo process groups (three processes, no Ray): every rank
gets every row each step, in lock-step, and a dead peer fails the step within the
timeout instead of hanging it."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from typing import Any

import pytest

from br_serve.serve.barrier import Barrier, BarrierError, open_store

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


def _run(steps: int, die: dict[int, int], timeout_s: float) -> dict[int, tuple[str, Any]]:
    ctx = mp.get_context("fork")  # torch is imported already: no re-import per process
    q = ctx.Queue()
    store, port = open_store("127.0.0.1", 1, 30)  # rank 0's store, hosted here
    procs = [ctx.Process(target=_rank, args=(r, port, steps, die.get(r), q, timeout_s))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    out: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + 90
    while len(out) < WORLD - len(die) and time.monotonic() < deadline:
        rank, status, data = q.get(timeout=90)
        out[rank] = (status, data)
    for p in procs:
        p.join(10)
        if p.is_alive():  # never leave a stuck rank behind (it would hold the test)
            p.kill()
            p.join(5)
    del store
    return out


def test_rows_reach_every_rank_and_a_dead_peer_fails_the_others() -> None:
    import torch  # noqa: F401  (loaded before the fork)

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
