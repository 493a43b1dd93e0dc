"""vllm-router's decode-rank rules (``--vllm-pd-disaggregation
--intra-node-data-parallel-size N``: one worker ``url@rank`` per rank, the rank pinned by
``X-data-parallel-rank``), modelled from vllm-project/router's source:
``src/policies/power_of_two.rs`` (commit fa999f98), ``src/policies/consistent_hash.rs``
(commit 080589a0) and ``src/policies/hash_key.rs`` (commit 335c57e2).

- ``vllm_router_p2c``: ``power_of_two``: two distinct ranks drawn uniformly, the one with
  the lower load wins (the first drawn on a tie). The load is the router's own count of
  requests it sent to the rank and has not seen finish (in PD the decode stream is open
  until the last token, so: the rank's running requests, counting this tick's
  admissions), plus a cached engine-reported load when its load monitor has one for that
  worker URL; that cached term is not modelled (docs/core.md says why).
  ``p2c_loads=none``: in vllm-router 0.1.17's PD mode (``--vllm-pd-disaggregation``,
  direct URLs) the decode worker's in-flight counter is never incremented
  (``vllm_pd_router.rs``: ``route_completion`` selects the worker and streams the
  two-stage request without a load guard), so both draws read 0 and the first drawn
  wins: uniform random, bound at arrival (``bind=arrival``). docs/peers.md shows the
  measurement that agrees with this and not with the in-flight count.
- ``router_round_robin``: the routers' ``round_robin``, bound at arrival.
- ``consistent_hash``: a ring of 160 virtual nodes per rank; a request goes to the first
  node clockwise from its key's hash. The key is, in order, a session header
  (``x-session-id``, ``x-user-id``, ``x-tenant-id``, ``x-correlation-id``,
  ``x-request-id``, ``x-trace-id``), a body field (``session_params.session_id``,
  ``user``, ``session_id``, ``user_id``), else a hash of the whole request body. The
  simulator's requests carry none of these and have distinct bodies, so the key is the
  request id (what ``x-request-id`` or the body hash gives): a uniform, load-blind
  assignment. The ring's hash here is BLAKE2b (vllm-router uses mcrouter's furc/murmur
  hash; only the uniform spread matters). The rank is chosen once per request and the
  request waits for it (:mod:`br_serve.core.policies._sticky`).
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from typing import Literal

from br_serve.core.options import NoOptions, Options, option
from br_serve.core.policies._sticky import BIND_DOC, Bind, StickyTargets, arrival_dispatch
from br_serve.core.policies.fcfs import FCFSPolicy, Ledger
from br_serve.core.policy import PolicyBase, PolicyContext, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.types import ClusterSnapshot, PoolRequest, TickResult


@dataclass(frozen=True, slots=True)
class VllmP2COptions(Options):
    bind: Bind = option("slot", doc=BIND_DOC)
    p2c_loads: Literal["inflight", "none"] = option(
        "inflight", doc="what the two draws compare: 'inflight' (the router's count of "
        "the rank's unfinished requests) or 'none' (every load 0, so the first drawn "
        "wins: a uniform random pick; what vllm-router 0.1.17's --vllm-pd-"
        "disaggregation path gets, which never counts a decode request on its worker)")


@register_policy("vllm_router_p2c")
class VllmRouterPowerOfTwo(FCFSPolicy[VllmP2COptions]):
    """See the module docstring."""

    Options = VllmP2COptions

    def __init__(self, options: VllmP2COptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self._sticky = StickyTargets()

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        if self.options.bind == "arrival":
            return arrival_dispatch(self._sticky, cluster, pool, self.choose)
        return super().schedule(cluster, pool, now_s, tick)

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        if len(feasible) == 1:
            return feasible[0]
        i, j = self.context.rng.choice(len(feasible), size=2, replace=False)
        a, b = feasible[int(i)], feasible[int(j)]
        if self.options.p2c_loads == "none":
            return a
        return a if led.running[a] <= led.running[b] else b


@register_policy("router_round_robin")
class RouterRoundRobin(PolicyBase[NoOptions]):
    """A real router's ``round_robin`` (smg, sglang-router and vllm-router alike: a
    counter over the workers, one per rank with DP awareness): the next rank in turn
    when the request arrives, whatever its load, and the rank queues the request (bound
    at arrival, :func:`br_serve.core.policies._sticky.arrival_dispatch`). The
    simulator's ``round_robin`` instead cycles over the ranks with a free slot when it
    binds from the pool (late binding), which is work-conserving: not what the routers
    do."""

    def __init__(self, options: NoOptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self._sticky = StickyTargets()
        self._next = 0

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        return arrival_dispatch(self._sticky, cluster, pool, self._turn)

    def _turn(self, req: PoolRequest, live: list[int], led: Ledger) -> int:
        g_all = len(led.alive)
        g = min(live, key=lambda r: (r - self._next) % g_all)
        self._next = (g + 1) % g_all
        return g


def ring_hash(key: str) -> int:
    """A 64-bit hash of ``key``, the same in every process (no PYTHONHASHSEED salt)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class ConsistentHashOptions(Options):
    virtual_nodes: int = option(160, ge=1, doc="ring points per rank (vllm-router: 160)")


@register_policy("consistent_hash")
class ConsistentHash(PolicyBase[ConsistentHashOptions]):
    """See the module docstring."""

    Options = ConsistentHashOptions

    def __init__(self, options: ConsistentHashOptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self._ring: list[tuple[int, int]] = []
        self._points: list[int] = []
        self._sticky = StickyTargets()

    def rank_of(self, key: str, alive: list[bool]) -> int:
        """The rank ``key`` maps to: the first ring point at or after its hash
        (wrapping), skipping dead ranks (vllm-router falls back to the first healthy)."""
        if len(self._ring) != len(alive) * self.options.virtual_nodes:
            self._ring = sorted((ring_hash(f"rank{g}:{i}"), g) for g in range(len(alive))
                                for i in range(self.options.virtual_nodes))
            self._points = [h for h, _ in self._ring]
        g = self._ring[bisect.bisect_left(self._points, ring_hash(key)) % len(self._ring)][1]
        return g if alive[g] else alive.index(True)

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        return self._sticky.dispatch(
            cluster, pool, lambda req, led: self.rank_of(req.request_id, led.alive))
