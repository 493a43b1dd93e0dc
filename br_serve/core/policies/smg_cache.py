"""smg's ``cache_aware`` rule as a decode-rank rule (``--dp-aware``: one logical worker
per rank), modelled from lightseekorg/smg commit 73da68ca
(``model_gateway/src/policies/cache_aware.rs``, ``crates/kv_index/src/string_tree.rs``;
the same algorithm is in sglang-router 0.3.2, commit c7f9bf9f, ``src/policies/
cache_aware.rs``).

The real rule, on the HTTP path: if the workers' in-flight request counts are
imbalanced (``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold x
min``; the KV-usage triggers are off by default), the least-loaded worker (ties: fewest
requests ever routed to it, then the lowest index). Otherwise it matches the request's
text against a radix tree of the texts it routed before: if the matched share of the
text exceeds ``cache_threshold`` the request goes to the worker that last routed a
request through the deepest matched node, else to the least-loaded worker; either way the
text is then inserted for the chosen worker.

Model: the text is the request's Mooncake ``hash_ids`` (one id per ``hash_block_tokens``
prompt tokens; shared ids = shared prefix), matched block by block; the matched share is
``min(blocks x hash_block_tokens, prompt) / prompt``. Without ``hash_ids`` (ServeGen,
Azure) nothing ever matches and the rule **is** the least-loaded branch: JSQ on the
router's in-flight counts with the routed-count tie-break. With the default thresholds
(64 requests apart) the imbalance branch never fires on 16-slot ranks. The tree is never
evicted (smg evicts at 2^26 characters per tree). The rank is chosen once per request and
the request waits for it (:mod:`br_serve.core.policies._sticky`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from br_serve.core.options import Options, option
from br_serve.core.policies._sticky import StickyTargets
from br_serve.core.policies.fcfs import Ledger
from br_serve.core.policy import PolicyBase, PolicyContext, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.types import ClusterSnapshot, PoolRequest, TickResult


@dataclass(frozen=True, slots=True)
class CacheAwareOptions(Options):
    cache_threshold: float = option(0.3, ge=0, le=1, doc="matched share of the prompt "
                                    "above which the cache-hit rank is used (smg 0.3)")
    balance_abs_threshold: int = option(64, ge=0, doc="in-flight request spread that, "
                                        "with the relative one, counts as imbalanced (64)")
    balance_rel_threshold: float = option(1.5, ge=1, doc="max / min in-flight ratio "
                                          "that, with the absolute one, counts as "
                                          "imbalanced (1.5)")
    hash_block_tokens: int = option(512, ge=1, doc="prompt tokens per trace hash id "
                                    "(Mooncake: 512)")


class _Node:
    __slots__ = ("children", "tenant")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.tenant = -1


@register_policy("smg_cache_aware")
class SmgCacheAware(PolicyBase[CacheAwareOptions]):
    """See the module docstring."""

    Options = CacheAwareOptions

    def __init__(self, options: CacheAwareOptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self._root = _Node()
        self._processed: dict[int, int] = {}
        self._sticky = StickyTargets()

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        return self._sticky.dispatch(cluster, pool, self._decide)

    def _decide(self, req: PoolRequest, led: Ledger) -> int:
        o = self.options
        healthy = [g for g, a in enumerate(led.alive) if a]
        loads = [led.running[g] for g in healthy]
        lo, hi = min(loads), max(loads)
        least = min(healthy, key=lambda g: (led.running[g], self._processed.get(g, 0), g))
        chosen = least
        if not (hi - lo > o.balance_abs_threshold and hi > lo * o.balance_rel_threshold):
            blocks, tenant = self._match(req.hash_ids or ())
            matched = min(blocks * o.hash_block_tokens, req.prompt_tokens)
            rate = matched / req.prompt_tokens if req.prompt_tokens else 0.0
            if rate > o.cache_threshold and tenant >= 0 and led.alive[tenant]:
                chosen = tenant
        self._insert(req.hash_ids or (), chosen)  # both branches record the route
        self._processed[chosen] = self._processed.get(chosen, 0) + 1
        return chosen

    def _match(self, ids: Any) -> tuple[int, int]:
        node, depth = self._root, 0
        for h in ids:
            nxt = node.children.get(h)
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        return depth, node.tenant

    def _insert(self, ids: Any, rank: int) -> None:
        node = self._root
        for h in ids:
            node = node.children.setdefault(h, _Node())
            node.tenant = rank
