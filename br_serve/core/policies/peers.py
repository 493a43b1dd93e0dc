"""Routers of the field, behind the same interface (docs/design.md, "Peers").

- ``sglang_total_tokens``: SGLang DP-attention ``total_tokens``: argmin of
  ``(total_tokens_g, total_requests_g)``, the admitted prompt added to the chosen rank
  until the next refresh (a tick is a refresh here).
- ``vllm_dp``: vLLM's internal DP load balancer (``DPLBAsyncMPClient.
  get_core_engine_for_request`` in ``vllm/v1/engine/core_client.py``, vllm-project/vllm
  commit 00080ee1): per engine ``max(inflight, waiting + running)`` plus
  ``waiting * w * max(0, kv_usage - 0.5)`` when requests wait (w = 6), the minimum
  taken scanning from a start index that advances by one per request, so ties rotate
  (round-robin) instead of going to the lowest rank. ``inflight`` is the front end's
  exact count of its unfinished requests there, ``waiting + running`` the coordinator's
  snapshot (every ~100 ms) plus its own increments; with one front end both are the
  rank's bound requests (the simulator's running count, this tick's admissions
  included). Requests admitted this tick count as waiting (their KV pull has not
  finished). Older vLLM (and docs/design.md's first notes) used ``waiting * 4 +
  running``; that rule is gone from vLLM.
- ``dynamo_decode``: Dynamo's decode cost: active KV blocks of the replica plus a
  per-request weight (in blocks) times its running requests.
- ``min_max``: the replica whose load after admission minimises the new maximum; ties
  go to the least loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from br_serve.core.options import NoOptions, Options, option
from br_serve.core.policies.fcfs import FCFSPolicy, Ledger
from br_serve.core.policy import PolicyContext, register_policy
from br_serve.core.types import UNLIMITED_TOKENS, PoolRequest


@register_policy("sglang_total_tokens")
class SGLangTotalTokens(FCFSPolicy[NoOptions]):
    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        return min(feasible, key=lambda g: (led.loads[g], led.running[g], g))


@dataclass(frozen=True, slots=True)
class VLLMDPOptions(Options):
    vllm_kv_weight: float = option(6.0, ge=0, doc="weight w of the KV-usage penalty on "
                                   "waiting requests")


@register_policy("vllm_dp")
class VLLMDataParallel(FCFSPolicy[VLLMDPOptions]):
    Options = VLLMDPOptions

    def __init__(self, options: VLLMDPOptions, context: PolicyContext) -> None:
        super().__init__(options, context)
        self._start = 0  # vLLM's eng_start_index (client 0 of 1 starts at engine 0)

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        w = self.options.vllm_kv_weight
        g_all = len(led.cap)

        def score(g: int) -> tuple[float, int]:
            waiting = led.inflight[g]
            running = led.running[g] - led.inflight[g]
            base = float(max(led.running[g], waiting + running))
            lim = led.kv_limit[g]
            if waiting and lim < UNLIMITED_TOKENS:
                base += waiting * w * max(0.0, led.loads[g] / lim - 0.5)
            return base, (g - self._start) % g_all  # ties: first from the start index

        g = min(feasible, key=score)
        self._start = (self._start + 1) % g_all
        return g


@dataclass(frozen=True, slots=True)
class DynamoOptions(Options):
    kv_block_tokens: int = option(16, ge=1, doc="tokens per KV block")
    dynamo_request_weight_blocks: float = option(1.0, ge=0, doc="blocks charged per "
                                                 "running request")


@register_policy("dynamo_decode")
class DynamoDecode(FCFSPolicy[DynamoOptions]):
    Options = DynamoOptions

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        blk = self.options.kv_block_tokens
        w = self.options.dynamo_request_weight_blocks
        return min(feasible, key=lambda g: (-(-led.loads[g] // blk) + w * led.running[g], g))


@register_policy("min_max")
class MinMax(FCFSPolicy[NoOptions]):
    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        top = led.max_alive_load()
        s = req.prompt_tokens
        return min(feasible, key=lambda g: (max(top, led.loads[g] + s), led.loads[g], g))
