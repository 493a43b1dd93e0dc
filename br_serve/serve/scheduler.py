"""The scheduler actor: the singleton that runs the core policy on the prompt pool.

A thin shell around core objects: a :class:`PromptPool`, a :class:`ClusterState` mirror
of the decode replicas and a policy. Every tick: ``mirror.snapshot()`` ->
``policy.schedule`` -> ``pool.remove_many`` + ``mirror.admit`` -> dispatch (``admit``
RPCs to decode replicas). Ticks run when new requests enter the pool and once per
decode step, after every member of the barrier group has reported that step.

Where state lives (why a crash loses nothing):
- The decode replicas own the running requests; the mirror is rebuilt from their
  per-step :class:`ReplicaReport`s, plus assignments dispatched but not yet reported
  (``inflight``). A restarted scheduler rebuilds it from ``DecodeReplica.report``.
- Pool entries are owned by the ingress until a decode replica confirms admission
  (``Admitted``): the scheduler's pool is a cache. After a restart (``incarnation``
  changes) the ingress resubmits its unconfirmed entries; ``submit`` is idempotent.

Faults: a replica whose barrier failed, or that the ingress lost, is pinged; the dead
ones are marked dead in the mirror and a new barrier generation is formed among the
survivors. Their requests are re-prefilled (or errored) by the ingress that owns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import numpy as np

from br_serve.core import (
    Assignment,
    FinishedRequests,
    PolicyContext,
    PoolFullError,
    PoolRequest,
    PromptPool,
    policy_class,
)
from br_serve.core.state import ClusterState
from br_serve.serve.messages import Admission, ReplicaReport
from br_serve.serve.stepstats import StepStats

log = logging.getLogger(__name__)

_PING_TIMEOUT_S = 3.0


class Scheduler:
    """See the module docstring. All methods run on the actor's event loop."""

    def __init__(self, config: dict[str, Any], decode_names: list[str]) -> None:
        from br_serve.serve.config import parse_graph_config

        self.cfg = parse_graph_config(config)
        self.g = len(decode_names)
        self.decode_names = list(decode_names)
        self.incarnation = uuid.uuid4().hex
        self.pool = PromptPool(self.cfg.pool_capacity)
        scale = self.cfg.time_scale
        a, b, c = (np.asarray(x) * scale for x in self.cfg.coefficients(self.g))
        self.mirror = ClusterState(self.g, self.cfg.slots, None, a, b, c)
        cls = policy_class(self.cfg.policy)
        horizon = self.cfg.predictor_horizon()
        self.predictor: Any = None
        if self.cfg.predictor is not None and horizon is not None:
            from predictors import make_predictor

            self.predictor = make_predictor(
                self.cfg.predictor, horizon=horizon, model_path=self.cfg.predictor_model_path,
                seed=self.cfg.seed, **self.cfg.predictor_options)
        self.policy = cls(self.cfg.policy_options_obj(), PolicyContext(
            rng=np.random.default_rng(self.cfg.seed), predictor=self.predictor))
        self.detail = cls.needs_for(self.policy.options).running_detail
        self.entries: dict[str, tuple[Admission, PoolRequest]] = {}
        self.inflight: list[dict[str, tuple[Admission, PoolRequest]]] = [
            {} for _ in range(self.g)]
        self.overflow: list[PoolRequest] = []
        self.decode: list[Any] = []
        self.generation = 0
        self.members: tuple[int, ...] = ()
        self.tick = 0
        self._last_step: dict[int, int] = {}
        self._wake: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._group_lock: asyncio.Lock | None = None
        self._main: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._t0 = time.perf_counter()
        self._metrics: Any = None
        self.stats_ = StepStats()

    # -- lifecycle --------------------------------------------------------------------
    def _start(self) -> None:
        if self._main is None:
            self._wake = asyncio.Event()
            self._ready = asyncio.Event()
            self._group_lock = asyncio.Lock()
            self._main = asyncio.get_running_loop().create_task(self._main_loop())
            try:
                from br_serve.serve.metrics import SchedulerMetrics

                self._metrics = SchedulerMetrics()
            except Exception as exc:  # metrics are best-effort
                log.warning("scheduler: metrics disabled: %s", exc)

    async def _ensure_ready(self) -> None:
        self._start()
        assert self._ready is not None
        await self._ready.wait()

    async def _main_loop(self) -> None:
        await self._bootstrap()
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self._tick_once()
            except Exception:  # never let one bad tick kill the loop
                log.exception("scheduler: tick failed")

    async def _bootstrap(self) -> None:
        """Find the replicas, rebuild the mirror from them, (re)form the barrier group."""
        import ray

        handles: list[Any] = []
        for name in self.decode_names:
            for _ in range(600):
                try:
                    handles.append(ray.get_actor(name, namespace=self.cfg.namespace))
                    break
                except ValueError:
                    await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"scheduler: decode replica {name!r} never appeared")
        self.decode = handles
        # the first ping also waits for the replicas' constructors (slow under load)
        alive, gens = await self._ping_all(list(range(self.g)), timeout_s=120.0)
        reports = await asyncio.gather(*(self.decode[g].report.remote() for g in alive),
                                       return_exceptions=True)
        for g in range(self.g):
            if g not in alive:
                self.mirror.set_alive(g, False)
        for rep in reports:
            if isinstance(rep, ReplicaReport):
                self._rebuild_replica(rep)
        same = len(set(gens.values())) == 1 and min(gens.values(), default=0) > 0
        last = [r for r in reports if isinstance(r, ReplicaReport)]
        members_ok = bool(last) and all(r.members == tuple(alive) for r in last)
        if same and members_ok and len(last) == len(alive):
            self.generation, self.members = next(iter(gens.values())), tuple(alive)
        else:
            self.generation = max(gens.values(), default=0)
            await self._form_group(tuple(alive))
        assert self._ready is not None
        self._ready.set()
        log.info("scheduler %s ready: generation %d, members %s", self.incarnation,
                 self.generation, self.members)

    async def _ping_all(self, which: list[int], timeout_s: float = _PING_TIMEOUT_S
                        ) -> tuple[list[int], dict[int, int]]:
        async def one(g: int) -> tuple[int, int] | None:
            try:
                res: tuple[int, int] = await asyncio.wait_for(self.decode[g].ping.remote(),
                                                              timeout_s)
                return res
            except Exception:
                return None

        res = await asyncio.gather(*(one(g) for g in which))
        alive = [g for g, r in zip(which, res, strict=True) if r is not None]
        gens = {g: r[1] for g, r in zip(which, res, strict=True) if r is not None}
        return alive, gens

    async def _form_group(self, members: tuple[int, ...]) -> None:
        """Form a new barrier generation among ``members``; drops ranks that fail to join
        and are dead, and retries (a few times) until every member joined."""
        for _ in range(5):
            self.generation += 1
            gen = self.generation
            self.members = members
            if not members:
                return
            try:
                port = await self.decode[members[0]].open_store.remote(gen)
                oks = await asyncio.gather(*(self.decode[m].join.remote(gen, rank, members, port)
                                             for rank, m in enumerate(members)),
                                           return_exceptions=True)
            except Exception as exc:
                log.warning("scheduler: forming generation %d failed: %s", gen, exc)
                oks = [False] * len(members)
            if all(ok is True for ok in oks):
                return
            alive, _ = await self._ping_all(list(members))
            self._mark_dead([g for g in members if g not in alive])
            members = tuple(alive)
        log.error("scheduler: could not form a barrier group among %s", members)

    def _mark_dead(self, dead: list[int]) -> None:
        import ray

        for g in dead:
            log.warning("scheduler: decode replica %d is dead", g)
            self.mirror.set_alive(g, False)
            self.inflight[g].clear()
            with contextlib.suppress(Exception):
                ray.kill(self.decode[g], no_restart=True)

    async def _recover(self, generation: int) -> None:
        assert self._group_lock is not None
        async with self._group_lock:
            if generation < self.generation:
                return  # already re-formed since that failure
            alive, _ = await self._ping_all(list(self.members))
            self._mark_dead([g for g in self.members if g not in alive])
            await self._form_group(tuple(alive))
        assert self._wake is not None
        self._wake.set()

    # -- RPCs -------------------------------------------------------------------------
    async def get_incarnation(self) -> str:
        await self._ensure_ready()
        return self.incarnation

    async def submit(self, entry: Admission) -> str:
        """Queue a prefilled request. Returns ``"queued"``, ``"duplicate"`` (already
        queued or running: idempotent resubmission), ``"full"`` (pool at capacity:
        backpressure) or ``"no_replica"`` (no decode replica alive)."""
        await self._ensure_ready()
        rid = entry.request_id
        if rid in self.entries or rid in self.mirror:
            return "duplicate"
        if not self.mirror.alive.any():
            return "no_replica"
        req = PoolRequest(rid, entry.prompt_tokens, enqueued_s=self._now(),
                          enqueued_tick=self.tick, arrival_s=entry.arrival_s,
                          prefix_hash=entry.prefix_hash)
        try:
            self.pool.add(req)
        except PoolFullError:
            return "full"
        self.entries[rid] = (entry, req)
        assert self._wake is not None
        self._wake.set()
        return "queued"

    async def cancel(self, request_id: str) -> None:
        """Drop a request still waiting in the pool (its client went away)."""
        if request_id in self.pool:
            self.pool.remove(request_id)
            self.entries.pop(request_id, None)

    async def locate(self, request_id: str) -> tuple[str, int]:
        """``("pool" | "running" | "unknown", replica)`` for a request (-1 if none)."""
        await self._ensure_ready()
        if request_id in self.pool:
            return "pool", -1
        if request_id in self.mirror:
            return "running", self.mirror.where(request_id)[0]
        return "unknown", -1

    async def report(self, rep: ReplicaReport) -> None:
        self._start()
        if not self.mirror.alive[rep.replica]:
            return
        self._observe_finished(rep)
        self._rebuild_replica(rep)
        if (rep.barrier_loads and rep.members and rep.replica == rep.members[0]
                and rep.generation == self.generation):
            loads = np.asarray(rep.barrier_loads, dtype=np.int64)
            members = np.asarray(rep.members, dtype=np.int64)
            model_s = float((self.mirror.step_a[members] * loads
                             + self.mirror.step_b[members]).max())
            imb = self.stats_.record_step(loads, int(sum(rep.barrier_running)),
                                          rep.compute_s + rep.barrier_s, model_s)
            if self._metrics is not None:
                self._metrics.imbalance.observe(imb)
        if self._metrics is not None:
            self._metrics.replica(rep.replica, rep.load_tokens, len(rep.running_ids))
        # Tick once per decode step, when every member has reported it: a tick on a
        # partial view would favour whichever replica happened to report first.
        self._last_step[rep.replica] = max(rep.step, self._last_step.get(rep.replica, -1))
        if self._wake is not None and all(
                self._last_step.get(m, -1) >= rep.step for m in self.members):
            self._wake.set()

    async def barrier_failed(self, replica: int, generation: int) -> None:
        """A replica's collective failed in ``generation``: find the dead, re-form."""
        await self._ensure_ready()
        self._spawn(self._recover(generation))

    async def replica_lost(self, replica: int) -> None:
        """The ingress lost contact with ``replica``: check it and re-form if needed."""
        await self._ensure_ready()
        self._spawn(self._recover(self.generation))

    async def state(self) -> dict[str, Any]:
        """Per-replica load/running/free slots, pool size, recent imbalance, policy."""
        await self._ensure_ready()
        loads = self.mirror.load_tokens()
        running = self.mirror.running_requests()
        free = self.mirror.free_slots()
        return {
            "policy": self.cfg.policy, "predictor": self.cfg.predictor,
            "incarnation": self.incarnation, "generation": self.generation,
            "members": list(self.members), "pool_size": len(self.pool),
            "pool_capacity": self.pool.capacity, "tick": self.tick,
            "recent_mean_imbalance_tokens": self.stats_.recent_mean_imbalance(),
            "replicas": [{"replica": g, "alive": bool(self.mirror.alive[g]),
                          "load_tokens": int(loads[g]), "running": int(running[g]),
                          "free_slots": int(free[g])} for g in range(self.g)],
        }

    async def stats(self) -> dict[str, Any]:
        """Counters since the last :meth:`reset_stats` (see :class:`StepStats`)."""
        await self._ensure_ready()
        return self.stats_.as_dict()

    async def reset_stats(self) -> None:
        self.stats_.reset()

    # -- internals --------------------------------------------------------------------
    def _retick_at(self, at_s: float) -> None:
        """Wake the tick loop at ``at_s`` (the policy's clock) even if no step reports."""
        if self._wake is not None:
            wake = self._wake
            asyncio.get_running_loop().call_later(max(0.0, at_s - self._now()), wake.set)

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _observe_finished(self, rep: ReplicaReport) -> None:
        if self.predictor is None or not rep.finished_ids:
            return
        prompts, outs = [], []
        for rid, out in zip(rep.finished_ids, rep.finished_output_tokens, strict=True):
            if rid in self.mirror:
                g, s = self.mirror.where(rid)
                prompts.append(int(self.mirror.prompt[g, s]))
                outs.append(out)
        if prompts:
            n = len(prompts)
            self.predictor.observe(FinishedRequests(
                prompt_tokens=np.asarray(prompts, dtype=np.int64),
                output_tokens=np.asarray(outs, dtype=np.int64),
                prefix_hash=np.full(n, -1, dtype=np.int64),
                finish_s=np.full(n, self._now())))

    def _rebuild_replica(self, rep: ReplicaReport) -> None:
        """Mirror rows of ``rep.replica`` := its report + dispatched-but-unreported."""
        g = rep.replica
        infl = self.inflight[g]
        for rid in (*rep.running_ids, *rep.finished_ids):
            infl.pop(rid, None)
        for rid in [i for i in self.mirror.ids[g] if i is not None]:
            self.mirror.finish(rid)
        for rid, p, d in zip(rep.running_ids, rep.prompt_tokens, rep.decoded_tokens,
                             strict=True):
            if rid in self.mirror:
                continue  # reported twice across a migration; keep the first
            self.mirror.admit(Assignment(rid, g, p), None, decoded_tokens=d)
        for rid, (_, req) in infl.items():
            if rid not in self.mirror and self.mirror.free_slots()[g] > 0:
                self.mirror.admit(Assignment(rid, g, req.prompt_tokens), req)

    def _tick_once(self) -> None:
        while self.overflow and not self.pool.is_full():
            self.pool.add(self.overflow.pop())
        if self._metrics is not None:
            self._metrics.pool.set(len(self.pool))
        if not len(self.pool) or not self.mirror.free_slots().any():
            return
        t0 = time.perf_counter()
        snap = self.mirror.snapshot(detail=self.detail)
        res = self.policy.schedule(snap, self.pool, self._now(), self.tick)
        self.tick += 1
        if res.retick_s is not None:  # a held request: tick again when its hold ends
            self._retick_at(res.retick_s)
        reqs = self.pool.remove_many(res.assignments)
        for a, req in zip(res.assignments, reqs, strict=True):
            entry, _ = self.entries.pop(a.request_id)
            self.mirror.admit(a, req)
            self.inflight[a.replica][a.request_id] = (entry, req)
            ref = self.decode[a.replica].admit.remote(entry)
            self._spawn(self._confirm(a.replica, entry, req, ref))
        dt = time.perf_counter() - t0
        self.stats_.record_tick(dt, len(res.assignments))
        if self._metrics is not None:
            self._metrics.tick_ms.observe(dt * 1e3)

    async def _confirm(self, g: int, entry: Admission, req: PoolRequest, ref: Any) -> None:
        """Await the replica's answer; on refusal or death put the request back."""
        try:
            ok = bool(await ref)
        except Exception as exc:
            log.warning("scheduler: dispatch of %s to %d failed: %s", entry.request_id, g, exc)
            ok = False
            self._spawn(self._recover(self.generation))
        if ok:
            return
        self.stats_.dispatch_failures += 1
        self.inflight[g].pop(entry.request_id, None)
        if entry.request_id in self.mirror and self.mirror.where(entry.request_id)[0] == g:
            self.mirror.finish(entry.request_id)
        self.entries[entry.request_id] = (entry, req)
        try:
            self.pool.add(req)
        except PoolFullError:
            self.overflow.append(req)
        assert self._wake is not None
        self._wake.set()
