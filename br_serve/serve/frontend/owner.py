"""The ingress's watch over the owner of the graph's actors (a mixin of the Streamer).

The scheduler, the decode replicas and the KV keeper all die with their owner, the
``Actors`` replica (:mod:`br_serve.serve.actors`); Serve then restarts it, and the new
owner makes new actors (another ``GraphActors.epoch``). A scheduler or decode replica
found dead makes the Streamer ask the owner for the current handles (``resolve``, one
check at a time, bounded by ``_RESOLVE_S``): the same epoch means only that actor went
(the paths in :mod:`br_serve.serve.frontend.events` handle it); another epoch, or a
failure to answer, means the actors were lost. Then every stream ends at once with an
explicit error (its tokens died with its replica, its KV with the keeper), new requests
get 503 until the owner answers again, and the Streamer adopts the new actors: its
polls, channel hand-overs and scheduler calls go to them; nothing of the old ones is
resubmitted.

An owner that is only slow to answer is not taken for gone. Serve's handle to it can lag
seconds on a loaded host, and taking it for gone would end every stream and refuse new
requests while the graph is intact. So a ``resolve`` that times out asks the GCS about
the current scheduler (:mod:`br_serve.serve.wire.liveness`). The scheduler restarts
in place whatever kills it (``max_restarts=-1``), and it is DEAD only when its owner
died: the GCS marked an owned actor DEAD 50 ms after its owner's death. Any other state
(ALIVE, or RESTARTING for a restart in place) means the actors are still there: nothing
ends, the check answers "not lost", and the caller handles one actor's death. DEAD, or
no state from the GCS, means lost, within ``_RESOLVE_S`` plus one GCS lookup as before.
If the owner did die and the GCS had not yet recorded it, the next failed call to the
scheduler (the watch makes one every 0.5 s) checks again.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from br_serve.serve.wire.liveness import ActorState, gcs_state
from br_serve.serve.wire.messages import StreamError
from br_serve.serve.wire.rpc import TIMEOUT
from br_serve.transport.lease import KVLease

log = logging.getLogger(__name__)

#: an owner that does not say which actors are current within this long is taken for
#: gone (its deployment restarts it: Serve queues the call meanwhile), unless the GCS
#: has its scheduler alive
_RESOLVE_S = 5.0
#: the end of every stream, and the 503 of new requests, while the actors are gone
ACTORS_LOST = ("the graph's actors were lost (their Actors replica died); "
               "Serve is restarting them: retry the request")

#: ``resolve()`` -> the owner's current ``GraphActors`` (scheduler, decode, keeper, epoch)
Resolver = Callable[[], Awaitable[Any]]


class OwnerWatch:
    """See the module docstring. Set up by :meth:`_owner_init`; the Streamer's state it
    resets on adoption is declared below."""

    lease: KVLease
    _scheduler: Any
    _decode: list[Any]
    _queues: dict[str, Any]
    _dead: set[int]
    _tasks: list[asyncio.Task[None]]
    _incarnation: str | None
    _poll_sent: dict[int, int]
    _chan_conn: dict[int, object]
    _chan_from: dict[int, int]
    _chan_broken: set[int]

    def _owner_init(self, resolve: Resolver | None, epoch: str,
                    actor_state: ActorState | None = None) -> None:
        self._resolve = resolve
        self._actor_state: ActorState = actor_state or gcs_state
        self._epoch = epoch
        self._actors_down = False
        self._actors_up = asyncio.Event()
        self._actors_up.set()
        self._actors_check: asyncio.Future[bool] | None = None

    async def _actors_lost(self) -> bool:
        """An actor was found dead: were all the graph's actors lost (see the module
        docstring)? True if so, after every stream was ended; new ones are then
        adopted in the background. One check at a time, shared by every caller, run
        as nobody's child (a request cancelled meanwhile must not cancel it)."""
        if self._resolve is None:
            return False
        if self._actors_down:
            return True
        if self._actors_check is None or self._actors_check.done():
            loop = asyncio.get_running_loop()
            self._actors_check = contextvars.Context().run(loop.create_task,
                                                           self._check_actors())
        return await asyncio.shield(self._actors_check)

    async def _check_actors(self) -> bool:
        assert self._resolve is not None
        try:
            actors = await asyncio.wait_for(self._resolve(), _RESOLVE_S)
        except Exception as exc:  # any failure to answer: the owner is gone for now
            if isinstance(exc, TIMEOUT) and await self._owner_lives():
                return False
            log.warning("ingress: the graph's actors are gone (owner: %r)", exc)
            self._end_all_streams()
            self._actors_down = True
            self._actors_up.clear()
            self._tasks.append(contextvars.Context().run(
                asyncio.get_running_loop().create_task, self._await_actors()))
            return True
        if actors.epoch == self._epoch:
            return False
        log.warning("ingress: the graph's actors were replaced (epoch %s -> %s)",
                    self._epoch, actors.epoch)
        self._end_all_streams()
        self._adopt(actors)
        return True

    async def _owner_lives(self) -> bool:
        """The owner did not answer in time: does the GCS still have its scheduler (DEAD
        only once its owner died)? See the module docstring."""
        state = await self._actor_state(self._scheduler)
        if state is None or state == "DEAD":
            return False
        log.warning("ingress: the owner of the graph's actors did not answer in %g s, "
                    "but its scheduler is %s per the GCS: the actors are still there",
                    _RESOLVE_S, state)
        return True

    async def _await_actors(self) -> None:
        """Ask the owner until it answers (Serve restarts it), then adopt its actors."""
        assert self._resolve is not None
        while True:
            try:
                actors = await asyncio.wait_for(self._resolve(), 4 * _RESOLVE_S)
                break
            except Exception as exc:  # still restarting
                log.info("ingress: waiting for the graph's actors: %r", exc)
                await asyncio.sleep(0.5)
        self._adopt(actors)

    def _end_all_streams(self) -> None:
        """Every stream ends with an explicit, final error: its replica, its KV and the
        scheduler holding its pool entry are gone."""
        for rid, q in list(self._queues.items()):
            q.put(StreamError(rid, ACTORS_LOST, retryable=False))

    def _adopt(self, actors: Any) -> None:
        """Use ``actors`` (new scheduler, decode replicas, keeper) from now on."""
        self._actors_down = False
        self._actors_up.set()
        if actors.epoch == self._epoch:  # the owner was only slow: nothing changed
            return
        self._scheduler = actors.scheduler
        self._decode = list(actors.decode)
        self.lease = KVLease(None, keeper=actors.keeper)
        self._epoch = actors.epoch
        self._incarnation = None  # a new scheduler: nothing of the old pool to resubmit
        self._dead.clear()
        # the old replicas' channels are over; a hello must come from a new poll
        self._chan_conn.clear()
        self._chan_broken.clear()
        for g in range(len(self._decode)):
            self._chan_from[g] = self._poll_sent.get(g, 0) + 1
        log.warning("ingress: serving with the graph's new actors (epoch %s)", self._epoch)
