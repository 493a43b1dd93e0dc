"""The graph's actors (scheduler, decode replicas, KV keeper): created and owned by
:class:`ActorOwner`, a one-replica Serve deployment of the graph (``Actors``), so that
deleting the app removes them and the ingress, which only borrows their handles, can
run with any number of replicas.

Names are fixed per app (:func:`actor_names`), so a restarted scheduler finds the
replicas, and a replacement takes the dead replica's name. The scheduler and the keeper
restart in place (``max_restarts=-1``); a decode replica does not (its KV and barrier
rank die with it): the owner replaces it with a new actor (:func:`replace_decode`) when
an ingress replica reports it lost (:meth:`ActorOwner.replace`; the first report of a
death replaces it, later reports of the same death get the replacement).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from br_serve.serve.config import GraphConfig
from br_serve.serve.wire.rpc import BUG, GONE, UNAVAILABLE

log = logging.getLogger(__name__)

#: a new replica's constructor imports torch and builds its engine: slow under load
_START_S = 120.0


def actor_names(app_name: str, replicas: int) -> tuple[str, list[str]]:
    """Names of the scheduler actor and the decode replica actors of one app."""
    return f"{app_name}:scheduler", [f"{app_name}:decode:{g}" for g in range(replicas)]


@dataclass(frozen=True, slots=True)
class GraphActors:
    """The handles of one app's actors. ``epoch`` names the :class:`ActorOwner` that
    created them: a new epoch means every actor is new (the old ones died with their
    owner)."""

    scheduler: Any
    decode: list[Any]
    keeper: Any
    epoch: str = ""


def _decode_options(cfg: GraphConfig, g: int) -> dict[str, Any]:
    _, names = actor_names(cfg.serve.app_name, cfg.replicas)
    return {"name": names[g], "namespace": cfg.serve.namespace, "get_if_exists": True,
            "max_restarts": 0, "max_concurrency": 1000, **cfg.replica_actor_options()}


def _makers(cfg: GraphConfig) -> tuple[Any, list[Any], Any]:
    """Functions that create (or find, by name) each actor: keeper, decode, scheduler."""
    import ray

    from br_serve.serve.replica.decode import DecodeReplica
    from br_serve.serve.scheduler.actor import Scheduler
    from br_serve.transport.keeper import KVKeeper, keeper_name

    sched_name, decode_names = actor_names(cfg.serve.app_name, cfg.replicas)

    def keeper() -> Any:
        return ray.remote(KVKeeper).options(
            name=keeper_name(cfg.serve.app_name), namespace=cfg.serve.namespace,
            get_if_exists=True,
            num_cpus=0, max_concurrency=1000, max_restarts=-1, max_task_retries=0,
        ).remote(cfg.kv_transport(), cfg.transport.mooncake_master,
                 ttl_s=cfg.keeper_ttl_s(), api_key=cfg.remote.api_key)

    def decode(g: int) -> Any:
        return ray.remote(DecodeReplica).options(**_decode_options(cfg, g)).remote(
            g, cfg, sched_name)

    def scheduler() -> Any:
        return ray.remote(Scheduler).options(
            name=sched_name, namespace=cfg.serve.namespace, get_if_exists=True, num_cpus=0,
            max_restarts=-1, max_task_retries=0, max_concurrency=1000,
        ).remote(cfg, decode_names)

    return keeper, [lambda g=g: decode(g) for g in range(cfg.replicas)], scheduler


async def create_actors(cfg: GraphConfig, attempts: int = 40) -> GraphActors:
    """Create (or find) the actors and wait until each one's constructor ran.

    An ingress that restarts after a crash finds no actors (they died with it, their
    owner) or, for a moment, their dead handles under the same names: a handle that
    turns out dead is created again (bounded). Handles come from the creation calls:
    named-actor registration is asynchronous, so a lookup by name right away could fail.

    Raises:
        RuntimeError: an actor did not come up in ``attempts`` tries.
    """
    make_keeper, make_decode, make_scheduler = _makers(cfg)

    async def up(make: Any, what: str) -> Any:
        for _ in range(attempts):
            handle = make()
            try:
                await asyncio.wait_for(handle.__ray_ready__.remote(), _START_S)
                return handle
            except UNAVAILABLE as exc:  # a dead namesake: its name frees soon
                log.warning("graph actors: %s not up yet: %s", what, exc)
                await asyncio.sleep(0.5)
        raise RuntimeError(f"graph actors: {what} did not come up in {attempts} tries")

    keeper = await up(make_keeper, "kv keeper")
    decode = await asyncio.gather(*(up(m, f"decode replica {g}")
                                    for g, m in enumerate(make_decode)))
    sched = await up(make_scheduler, "scheduler")
    return GraphActors(sched, list(decode), keeper)


async def replace_decode(cfg: GraphConfig, g: int, old: Any, attempts: int = 40) -> Any:
    """A live actor for decode replica ``g`` in place of ``old`` (dead, or to be killed).

    The name frees once Ray has recorded the death, so creation is retried until a
    *new* actor answers its ping. Returns its handle.

    Raises:
        RuntimeError: no new actor answered within ``attempts`` tries.
    """
    import ray

    from br_serve.serve.replica.decode import DecodeReplica

    sched_name, _ = actor_names(cfg.serve.app_name, cfg.replicas)
    with contextlib.suppress(*GONE, ValueError):
        ray.kill(old, no_restart=True)
    old_id = old._actor_id if hasattr(old, "_actor_id") else None
    for _ in range(attempts):
        handle: Any = ray.remote(DecodeReplica).options(**_decode_options(cfg, g)).remote(
            g, cfg, sched_name)
        if old_id is not None and handle._actor_id == old_id:
            await asyncio.sleep(0.5)  # the name still points at the dead one
            continue
        try:
            await asyncio.wait_for(handle.ping.remote(), _START_S)
            log.warning("graph actors: decode replica %d replaced", g)
            return handle
        except UNAVAILABLE as exc:
            log.warning("graph actors: replacement of decode replica %d not up yet: %s", g, exc)
        except BUG:
            log.exception("graph actors: replacement of decode replica %d raised in ping", g)
            return handle
        await asyncio.sleep(0.5)
    raise RuntimeError(f"decode replica {g}: no replacement came up in {attempts} tries")


def _actor_id(handle: Any) -> Any:
    return handle._actor_id if hasattr(handle, "_actor_id") else id(handle)


class ActorOwner:
    """Creates the graph's actors and owns them (their lifetime is this replica's).

    Wrapped as the one-replica Serve deployment ``Actors`` by
    :func:`br_serve.serve.graph.build`; every ingress replica asks it for the handles
    (:meth:`handles`) and for a replacement of a decode replica it lost
    (:meth:`replace`).
    """

    # Serve awaits an async constructor (the replica is ready only when it returns)
    async def __init__(self, cfg: GraphConfig) -> None:  # type: ignore[misc]
        self.cfg = cfg
        if cfg.is_remote:  # a clear error now, not a replica that never comes up
            from br_serve.serve.prefill.remote import check_endpoints

            remote = cfg.remote
            await asyncio.to_thread(check_endpoints, remote.decode_urls, "remote.decode_urls",
                                    remote.connect_s * 2, remote.api_key)
        self.actors = dataclasses.replace(await create_actors(cfg), epoch=uuid.uuid4().hex[:12])
        self._locks = [asyncio.Lock() for _ in range(cfg.replicas)]

    async def handles(self) -> GraphActors:
        """The current handles (a replaced decode replica's new one included)."""
        return self.actors

    async def replace(self, g: int, old: Any) -> tuple[Any, str]:
        """A live handle for decode replica ``g``, which the caller lost as ``old``: a new
        actor if ``old`` is still the current one, else the one that replaced it; and
        this owner's epoch (another than the caller's: ``old`` died with an earlier
        owner, and every actor is new).

        Raises:
            RuntimeError: no new actor came up (see :func:`replace_decode`).
        """
        async with self._locks[g]:
            cur = self.actors.decode[g]
            if _actor_id(cur) != _actor_id(old):
                return cur, self.actors.epoch  # replaced already (or a new owner's)
            new = await replace_decode(self.cfg, g, cur)
            decode = list(self.actors.decode)
            decode[g] = new
            self.actors = dataclasses.replace(self.actors, decode=decode)
            return new, self.actors.epoch
