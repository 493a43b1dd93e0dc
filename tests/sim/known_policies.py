"""Policies with answers known by hand, loaded by qualified name (``tests.sim.known_policies.X``)
so they never enter the package's registry.

- :class:`SkipLast`: FCFS, fewest running requests, but never the last replica: with
  every slot busy it runs ``(G - 1) / G`` of JSQ's requests per step.
- :class:`SmallestFirst`: admits the smallest prompts in the pool first (a deferral
  policy: large prompts wait), to the replica with the fewest running requests.
"""

from __future__ import annotations

from br_serve.core import NoOptions, PolicyBase
from br_serve.core.policies.fcfs import Ledger
from br_serve.core.pool import PromptPool
from br_serve.core.types import Assignment, ClusterSnapshot, TickResult


class SkipLast(PolicyBase[NoOptions]):
    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        led = Ledger(cluster)
        last = len(led.cap) - 1
        out: list[Assignment] = []
        for req in pool.fcfs():
            feas = [g for g in led.feasible(req.prompt_tokens) if g != last]
            if not feas:
                break
            g = min(feas, key=lambda r: (led.running[r], r))
            led.admit(g, req.prompt_tokens)
            out.append(Assignment(req.request_id, g, req.prompt_tokens))
        return TickResult(assignments=tuple(out))


class SmallestFirst(PolicyBase[NoOptions]):
    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        led = Ledger(cluster)
        out: list[Assignment] = []
        for rid in list(pool.sorted_ids):
            req = pool.get(rid)
            feas = led.feasible(req.prompt_tokens)
            if not feas:
                continue
            g = min(feas, key=lambda r: (led.running[r], r))
            led.admit(g, req.prompt_tokens)
            out.append(Assignment(req.request_id, g, req.prompt_tokens))
        return TickResult(assignments=tuple(out))
