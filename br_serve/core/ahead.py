"""Dispatch ahead: which of a replica's places a tick offers the policy (pure).

With an engine queue (``pool.dispatch_ahead = d``) a replica has ``engine_slots``
places that run at once and ``d`` more in the engine's own queue (FIFO). A request
bound to a queue place waits there until the requests ahead of it leave; that is what
dispatch ahead is for (the queued request starts at the step a slot frees, with no
report, tick and admit in between), but a request bound ahead is committed to its
replica for as long as it waits, while late binding gives it to whichever replica
frees a slot first. Two rules keep the commitment cheap:

- **engine slots first**: while any alive replica has a free engine slot, the tick
  offers only free engine slots (a request never waits in one replica's queue while
  another could run it now);
- **queue only a backlog**: queue places are offered only for the requests the pool
  holds beyond ``d`` per alive replica (:func:`queue_room`). In a backlog that keeps
  every queue full; when the pool drains, its last requests bind late, to the
  replicas that free a slot first, instead of filling the queues of the replicas that
  happened to report first (which then run an extra round of requests while the
  others idle: measured at G = 8, see docs/peers.md).

Without a queue (``engine_slots`` None) nothing changes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from br_serve.core.types import ClusterSnapshot, IntArray


def engine_free(snap: ClusterSnapshot) -> IntArray:
    """Free engine slots per replica (0 for a dead one; all free places without a
    queue)."""
    if snap.engine_slots is None:
        return snap.free_slots
    out: IntArray = np.where(snap.alive,
                             np.maximum(snap.engine_slots - snap.running_requests, 0), 0)
    return out


def engine_slots_only(snap: ClusterSnapshot) -> ClusterSnapshot:
    """``snap`` offering only its free engine slots (a replica's queue places hidden:
    its ``slots`` lowered to ``max(engine_slots, running)``)."""
    if snap.engine_slots is None:
        return snap
    cap = np.maximum(np.minimum(snap.slots, snap.engine_slots), snap.running_requests)
    cap.flags.writeable = False
    return dataclasses.replace(snap, slots=cap)


def queue_room(snap: ClusterSnapshot, pool_size: int) -> int:
    """How many of the ``pool_size`` pool requests may be bound to queue places now:
    those beyond ``d`` per alive replica (``d = slots - engine_slots``), and none while
    an engine slot is free."""
    if snap.engine_slots is None or engine_free(snap).any():
        return 0
    depth = (snap.slots - snap.engine_slots)[snap.alive]
    return max(0, min(pool_size - int(depth.sum()), int(snap.free_slots.sum())))
