"""Routers of the field, behind the same interface (DESIGN section 6).

- ``sglang_total_tokens``: SGLang DP-attention ``total_tokens``: argmin of
  ``(total_tokens_g, total_requests_g)``, the admitted prompt added to the chosen rank
  until the next refresh (a tick is a refresh here).
- ``vllm_dp``: vLLM's DP load balancer: ``max(inflight, waiting + running)`` plus
  ``waiting * w * max(0, kv_usage - 0.5)``; requests admitted this tick count as both
  in flight and waiting (their KV pull has not finished).
- ``dynamo_decode``: Dynamo's decode cost: active KV blocks of the replica plus a
  per-request weight (in blocks) times its running requests.
- ``min_max``: the replica whose load after admission minimises the new maximum; ties
  go to the least loaded.
"""

from __future__ import annotations

from br_serve.core.policies.baselines import _Base
from br_serve.core.policies.fcfs import Ledger
from br_serve.core.registry import register
from br_serve.core.types import UNLIMITED_TOKENS, PoolRequest


@register("sglang_total_tokens")
class SGLangTotalTokens(_Base):
    name = "sglang_total_tokens"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        return min(feasible, key=lambda g: (led.loads[g], led.running[g], g))


@register("vllm_dp")
class VLLMDataParallel(_Base):
    name = "vllm_dp"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        w = self.config.vllm_kv_weight

        def score(g: int) -> tuple[float, int]:
            waiting = led.inflight[g]
            running = led.running[g] - led.inflight[g]
            base = float(max(led.inflight[g], waiting + running))
            lim = led.kv_limit[g]
            if waiting and lim < UNLIMITED_TOKENS:
                base += waiting * w * max(0.0, led.loads[g] / lim - 0.5)
            return base, g

        return min(feasible, key=score)


@register("dynamo_decode")
class DynamoDecode(_Base):
    name = "dynamo_decode"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        blk = self.config.kv_block_tokens
        w = self.config.dynamo_request_weight_blocks
        return min(feasible, key=lambda g: (-(-led.loads[g] // blk) + w * led.running[g], g))


@register("min_max")
class MinMax(_Base):
    name = "min_max"

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        top = led.max_alive_load()
        s = req.prompt_tokens
        return min(feasible, key=lambda g: (max(top, led.loads[g] + s), led.loads[g], g))
