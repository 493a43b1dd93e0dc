"""The physical step barrier: one collective per decode step across the decode replicas.

A :class:`Barrier` is one *generation* of the group: ``world`` ranks (the alive decode
replicas, in ``members`` order) connected through a torch.distributed store hosted by
rank 0. Every step each rank contributes its own row ``(load_tokens, running, reports,
compute_s)``; rank 0 gathers the ``(world, 4)`` matrix and broadcasts it back, so the step
cannot end before the slowest replica arrives (nobody leaves the broadcast before rank
0 has heard from all), and every rank learns the loads at the barrier (and which
members report this step, so that rank 0 can tell the scheduler whose reports to wait
for). Gather + broadcast costs ``2 (world - 1)`` messages per step in all; gloo's ring
all-reduce costs ``2 (world - 1)`` per rank, and on a shared 2-core host it was most of
a step at G = 16 (64 ms against 8 ms, ``docs/serving.md``).

Failure contract: a dead or hung peer makes :meth:`Barrier.exchange` raise
:class:`BarrierError` within ``timeout_s``. A broken generation is never reused: the
scheduler forms a new one (new store port, generation + 1) among the survivors.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

#: columns of a barrier row: load_tokens, running, reports, compute_s
ROW = 4


class BarrierError(RuntimeError):
    """The collective failed (peer died, timed out, or the group was closed)."""


# torch.distributed's errors (DistError, DistBackendError, DistStoreError, gloo's own)
# are RuntimeErrors; a refused or reset connection is an OSError. Anything else is a bug.
_DIST_ERRORS = (RuntimeError, OSError)


def open_store(host: str, generation: int, timeout_s: float) -> tuple[Any, int]:
    """Host a new TCP store on a free port (rank 0 of a generation). Returns (store, port)."""
    import torch.distributed as dist

    store = dist.TCPStore(host, 0, None, True,  # type: ignore[attr-defined]
                          timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return store, int(store.port)


class Barrier:
    """One generation of the decode group (see module docstring).

    Construction blocks until all ``world`` ranks joined (at most ``join_timeout_s``);
    each :meth:`exchange` waits at most ``timeout_s``.

    ``backend`` is ``"gloo"`` on CPU; other backends need a device per rank and go
    through ``torch.distributed``'s default group (one generation per process at a time).
    """

    def __init__(self, backend: str, host: str, port: int, rank: int,
                 members: tuple[int, ...], generation: int, timeout_s: float,
                 store: Any = None, join_timeout_s: float = 60.0) -> None:
        import torch
        import torch.distributed as dist

        self.rank = rank
        self.members = members
        self.world = len(members)
        self.generation = generation
        #: exchanges completed in this generation (the same on every member: lock-step)
        self.steps = 0
        self.backend = backend
        self._torch = torch
        self._op_timeout = datetime.timedelta(seconds=timeout_s)
        # Joining waits for every rank's process (slow under load); steps must not.
        td = datetime.timedelta(seconds=max(timeout_s, join_timeout_s))
        try:
            if store is None:  # a dead rank 0 (no store to connect to) fails here
                store = dist.TCPStore(host, port, None, False,  # type: ignore[attr-defined]
                                      timeout=td)
            self._store = store  # rank 0 keeps the master alive as long as the group lives
            prefixed = dist.PrefixStore(f"br_gen{generation}", store)  # type: ignore[attr-defined]
            if backend == "gloo":
                self._pg: Any = dist.ProcessGroupGloo(prefixed, rank, self.world, td)
                self._default = False
            else:
                dist.init_process_group(backend, store=prefixed, rank=rank,
                                        world_size=self.world, timeout=td)
                self._pg = None
                self._default = True
        except _DIST_ERRORS as exc:
            raise BarrierError(f"barrier gen {generation}: join failed: {exc}") from exc

    def exchange(self, load_tokens: int, running: int, reports: int = 0,
                 compute_s: float = 0.0) -> np.ndarray:
        """Exchange this rank's row; returns the ``(world, 4)`` float64 matrix of all rows
        ``(load_tokens, running, reports, compute_s)`` (the first three are integers,
        exact in float64).

        Raises:
            BarrierError: the collective failed or timed out.
        """
        torch = self._torch
        try:
            if self._default:  # accelerator backends: one all-reduce on the default group
                import torch.distributed as dist

                t = torch.zeros((self.world, ROW), dtype=torch.float64)
                t[self.rank] = torch.tensor([load_tokens, running, reports, compute_s],
                                            dtype=torch.float64)
                dist.all_reduce(t)
            else:
                t = self._gather_broadcast(torch.tensor(
                    [load_tokens, running, reports, compute_s], dtype=torch.float64))
        except _DIST_ERRORS as exc:
            raise BarrierError(f"barrier gen {self.generation}: exchange failed: {exc}"
                               ) from exc
        self.steps += 1
        out: np.ndarray = t.numpy().copy()
        return out

    def _gather_broadcast(self, row: Any) -> Any:
        import torch.distributed as dist

        torch = self._torch
        gather = dist.GatherOptions()
        gather.rootRank = 0
        if self.rank == 0:
            rows = [torch.zeros(ROW, dtype=torch.float64) for _ in range(self.world)]
            self._pg.gather([rows], [row], gather).wait(self._op_timeout)
            mat = torch.stack(rows)
        else:
            self._pg.gather([], [row], gather).wait(self._op_timeout)
            mat = torch.zeros((self.world, ROW), dtype=torch.float64)
        bcast = dist.BroadcastOptions()
        bcast.rootRank, bcast.rootTensor = 0, 0
        self._pg.broadcast([mat], bcast).wait(self._op_timeout)
        return mat

    def close(self) -> None:
        if self._default:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        self._pg = None
        self._store = None
