"""The exception types of the graph's RPC edges, named once.

An actor call can fail in three ways that mean different things, and each edge catches
only what it can handle:

- :data:`GONE`: the actor died or cannot be reached (Ray's ``RayActorError`` family):
  the caller treats the peer as dead or restarting;
- :data:`TIMEOUT`: no answer within the caller's bound (``asyncio.wait_for``'s
  ``TimeoutError``, Ray's ``GetTimeoutError``): the peer may be hung;
- ``RayTaskError``: the remote method itself raised, i.e. a bug on the other side. It
  is *not* a sign of death (a bug inside ``ping`` must not get a live replica killed):
  edges log it with its traceback and carry on as if the call had not happened.
"""

from __future__ import annotations

import asyncio

from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

GONE: tuple[type[BaseException], ...] = (RayActorError,)
# asyncio.TimeoutError is TimeoutError from Python 3.11 on, a class of its own on 3.10
TIMEOUT: tuple[type[BaseException], ...] = (TimeoutError, asyncio.TimeoutError,
                                            GetTimeoutError)
#: a failure of the peer's availability (not of its code)
UNAVAILABLE: tuple[type[BaseException], ...] = GONE + TIMEOUT
BUG: tuple[type[BaseException], ...] = (RayTaskError,)
