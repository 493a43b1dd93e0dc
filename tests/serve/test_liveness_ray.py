"""The GCS as the authority on a slow actor (``br_serve.serve.wire.liveness``),
against a real local cluster with no dashboard, as the graph runs.

The ingress relies on this to tell a slow actor from a dead one. It must say ALIVE for
an actor whose event loop is blocked, so that a call to it times out. It must say DEAD
right after the actor is killed, and right after the actor's owner dies (as the graph's
actors die with their ``Actors`` replica). ``liveness.reply`` must wait for such a call
to answer. The lookup uses one of Ray's private APIs, and this test breaks if Ray
changes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from br_serve.serve.wire import liveness
from tests.serve.helpers import start_ray

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    import ray

    start_ray()
    yield
    ray.shutdown()


class _Stalling:
    async def poll(self) -> str:
        return "events"

    async def stall(self, s: float) -> None:
        time.sleep(s)  # blocks the actor's event loop, as a starved process would


class _Owned:
    def ping(self) -> int:
        return 1


class _Owner:
    def __init__(self) -> None:
        import ray

        self.child = ray.remote(_Owned).options(max_restarts=-1).remote()

    def children(self) -> list[Any]:
        return [self.child]


async def _until_state(handle: Any, want: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while await liveness.gcs_state(handle) != want:
        assert time.monotonic() - t0 < timeout_s, want
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


def test_the_gcs_tells_a_stalled_actor_from_a_dead_one(ray_up: None) -> None:
    import ray

    actor: Any = ray.remote(_Stalling).options(max_concurrency=4).remote()

    async def go() -> None:
        assert await actor.poll.remote() == "events"
        assert await liveness.gcs_state(actor) == liveness.ALIVE
        stall = actor.stall.remote(4.0)
        await asyncio.sleep(0.3)
        # its poll misses a 0.5 s bound while the GCS answers ALIVE; reply waits for it
        t0 = time.monotonic()
        got = await liveness.reply(actor.poll.remote(), actor, liveness.gcs_state,
                                   "stalled actor", "poll", 0.5, 30.0, who="test")
        assert got == "events" and time.monotonic() - t0 > 1.0
        await stall
        ray.kill(actor, no_restart=True)
        assert await _until_state(actor, "DEAD", 10) < 5

    asyncio.run(go())


def test_an_owned_actor_is_dead_in_the_gcs_once_its_owner_died(ray_up: None) -> None:
    """The scheduler restarts in place (``max_restarts=-1``), but not once its owner is
    gone: the owner's death is what the ingress reads from its state."""
    import ray

    owner: Any = ray.remote(_Owner).remote()

    async def go() -> None:
        (child,) = await owner.children.remote()
        assert await child.ping.remote() == 1
        assert await liveness.gcs_state(child) == liveness.ALIVE
        ray.kill(owner, no_restart=False)
        assert await _until_state(child, "DEAD", 10) < 5

    asyncio.run(go())
