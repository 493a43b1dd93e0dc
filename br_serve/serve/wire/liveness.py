"""Slow is not dead: a caller waits on an actor that is late but alive.

Used by the ingress (decode replicas' polls, the owner's ``resolve``) and the scheduler
(decode replicas' pings and reports). It sits in ``wire``, which knows no room, so
that both may import it (the import contracts let the scheduler import ``wire``, not
``frontend``).

On a loaded host an actor's process can go unscheduled for seconds
(``docs/vllm-cpu.md``), so a call that misses its bound says nothing about death. A
death shows otherwise: Ray fails the calls of an actor that died with a
``RayActorError`` (:data:`~br_serve.serve.wire.rpc.GONE`) once the GCS has recorded
the death. Past its bound, a call therefore asks the GCS's actor table, which answers
while the actor's own event loop is stalled (:func:`gcs_state`).

Measured on this host (Ray 2.60, no dashboard): the lookup took 2-3 ms, from the driver
and from inside an actor. It said ALIVE while the actor's event loop was blocked and a
call to it timed out. It said DEAD 3 ms after a ``ray.kill``, and 50 ms after the
owner of an owned actor was killed (death cause: "its owner has died").

Contract of :func:`reply` (``call`` to ``handle``, checked every ``every_s``, at most
``max_s``):

- it returns the call's answer, or raises what the call raised (``GONE`` as soon as
  Ray reports the death);
- it raises ``TimeoutError`` after ``every_s`` when the authority says anything but
  ALIVE (DEAD, or ``None``: it cannot say). That is as prompt as the plain timeout it
  replaces;
- while the authority says ALIVE it keeps waiting on the same call and logs a warning
  at each check. It never drops the call and sends another: a long-poll's reply holds
  events that exist nowhere else. After ``max_s`` it raises ``TimeoutError`` whatever
  the authority says, so an actor whose process lives but never answers is still
  declared lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: ``state_of(handle)`` -> the actor's state per an authority that does not need the
#: actor to answer ("ALIVE", "RESTARTING", "DEAD", ...), or None when it cannot say
ActorState = Callable[[Any], Awaitable[str | None]]

ALIVE = "ALIVE"
#: the bound on one GCS lookup (a few ms when the host is idle)
_GCS_S = 5.0


async def gcs_state(handle: Any) -> str | None:
    """``handle``'s actor state in the GCS's actor table, or None: not a Ray actor handle
    (the Ray-free tests' fakes), Ray not connected, or no answer within ``_GCS_S``.

    ``ray.util.state.get_actor`` is the public route, but it goes through the dashboard,
    which the graph's deployments leave off. This uses ``ray._private.state.actors``,
    a direct GCS read; Ray's own ``RuntimeContext.was_current_actor_reconstructed``
    uses it the same way. It is a blocking call, so it runs in a thread. If Ray
    changes it, the answer is None and timeouts count as deaths, as before."""
    actor_id = getattr(handle, "_actor_id", None)
    if actor_id is None:
        return None
    try:
        info = await asyncio.wait_for(asyncio.to_thread(_actor_info, actor_id.hex()),
                                      _GCS_S)
    except Exception as exc:  # the GCS unreachable or slow, or the private API moved
        log.warning("no actor state from the GCS: %r", exc)
        return None
    state = info.get("State") if isinstance(info, dict) else None
    return state if isinstance(state, str) else None


def _actor_info(actor_id_hex: str) -> Any:
    from ray._private import state

    return state.actors(actor_id=actor_id_hex)


async def reply(call: Awaitable[T], handle: Any, state_of: ActorState, what: str,
                method: str, every_s: float, max_s: float, *, who: str) -> T:
    """The answer to ``call``, ``handle``'s ``method`` (``what`` names the actor in the
    log and the errors, ``who`` the waiting room in the log); see the module docstring.

    Raises:
        TimeoutError: no answer, and the actor is not alive per ``state_of``, or
            ``max_s`` passed.
    """
    fut = asyncio.ensure_future(call)
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + max_s
    # the hard bound's error says the process lives only if the authority said so; with
    # max_s <= every_s (the scheduler's bounds for a replica still being built) it was
    # never asked
    seen_alive = False
    try:
        while True:
            await asyncio.wait((fut,), timeout=max(0.0, min(every_s, deadline - loop.time())))
            if fut.done():
                return fut.result()
            waited = loop.time() - start
            if loop.time() >= deadline:
                alive = ", though its process is alive" if seen_alive else ""
                raise TimeoutError(f"{what}: no {method} answer in {waited:.1f} s (the "
                                   f"bound){alive}")
            state = await state_of(handle)
            if fut.done():  # it answered while the GCS was asked
                return fut.result()
            if state != ALIVE:
                raise TimeoutError(f"{what}: no {method} answer in {waited:.1f} s; "
                                   f"{state or 'state unknown'} per the GCS")
            seen_alive = True
            log.warning("%s: %s slow: no %s answer in %.1f s, alive per the GCS; "
                        "waiting (declared lost after %.0f s)", who, what, method, waited,
                        max_s)
    finally:
        if not fut.done():
            fut.cancel()
