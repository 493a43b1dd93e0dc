"""The SGLang Model Gateway's (smg, formerly sglang-router) decode-rank rules, modelled
from its source (docs/core.md, "The field's rules").

Source read: lightseekorg/smg at commit 73da68ca (2026-08-07, v1.9.0 + 48), files
``model_gateway/src/policies/{dp_min_token,least_load,power_of_two,cache_aware}.rs``,
``model_gateway/src/worker/monitor.rs`` (the load poll),
``model_gateway/src/routers/http/pd_router.rs`` (the PD path) and
``bindings/python/src/smg/router_args.py`` (defaults); the sglang-router 0.3.2 wheel
is commit c7f9bf9f (2026-01-15) of the same repository, which has ``power_of_two`` and
``cache_aware`` but neither ``--dp-minimum-tokens-scheduler`` (smg >= 1.4.1) nor
``least_load`` (smg >= 1.5.0).

What every rule here shares: the router learns engine load only from a poll every
``--load-monitor-interval`` seconds (default 10; :class:`LoadPoll`), and a rule picks a
rank when the simulator binds a request, among the ranks with a free slot and KV room
(the real router picks at arrival and the chosen rank queues the request; here the pool
is the queue, as for every policy of this package). ``bind=arrival``
(:mod:`br_serve.core.policies._sticky`) picks once, when the request is first seen,
among all live ranks, and the request waits for that rank: the real router's timing,
which ``bench-peers --sim`` uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from br_serve.core.options import Options, option
from br_serve.core.policies._polled import LoadPoll
from br_serve.core.policies._sticky import BIND_DOC, Bind, StickyTargets, arrival_dispatch
from br_serve.core.policies.fcfs import FCFSPolicy, Ledger
from br_serve.core.policy import OptionsT, PolicyContext, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.types import UNLIMITED_TOKENS, ClusterSnapshot, PoolRequest, TickResult

_REFRESH_DOC = ("seconds between two load polls of the engines (smg --load-monitor-"
                "interval, default 10; 0: every tick, i.e. fresh loads)")


class _Polled(FCFSPolicy[OptionsT]):
    """A rule that reads a :class:`LoadPoll` refreshed at the start of each tick."""

    def __init__(self, options: OptionsT, context: PolicyContext) -> None:
        super().__init__(options, context)
        self.poll = LoadPoll(float(options.load_refresh_s))  # type: ignore[attr-defined]
        self._sticky = StickyTargets()

    def polled(self, cluster: ClusterSnapshot, now_s: float) -> None:
        """Called with each tick's snapshot; a subclass resets its between-polls state."""
        self.poll.refresh(cluster, now_s)

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        self.polled(cluster, now_s)
        if self.options.bind == "arrival":  # type: ignore[attr-defined]
            return arrival_dispatch(self._sticky, cluster, pool, self.choose)
        return super().schedule(cluster, pool, now_s, tick)


@dataclass(frozen=True, slots=True)
class MinTokensOptions(Options):
    load_refresh_s: float = option(10.0, ge=0, doc=_REFRESH_DOC)
    bind: Bind = option("slot", doc=BIND_DOC)
    min_tokens_increment: Literal["prompt", "one"] = option(
        "prompt", doc="what the router adds to the chosen rank until the next poll: "
        "'prompt' (its estimate of the prompt, 1.3 x whitespace words, when the worker "
        "policy reads the request text, as the default cache_aware does; modelled as the "
        "prompt's tokens) or 'one' (no request text: round_robin, power_of_two, ...)")


@register_policy("smg_min_tokens")
class SmgMinTokens(_Polled[MinTokensOptions]):
    """``--dp-minimum-tokens-scheduler`` (dp_min_token.rs, monitor.rs
    ``select_and_increment_lowest_dp_load``): the rank with the fewest used tokens in
    the cached per-rank ``num_used_tokens`` of the last poll, ties to the lowest rank;
    the chosen rank's cached value then grows by the request's estimated cost
    (pd_router.rs: ``ceil(1.3 x words)`` of the request text when the worker policy
    needs the text, else 1) until the next poll overwrites it."""

    Options = MinTokensOptions

    def polled(self, cluster: ClusterSnapshot, now_s: float) -> None:
        if self.poll.refresh(cluster, now_s):
            self._cached = list(self.poll.used_tokens)

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        g = min(feasible, key=lambda r: (self._cached[r], r))
        self._cached[g] += (req.prompt_tokens if self.options.min_tokens_increment == "prompt"
                            else 1)
        return g


_REPORTS_DOC = ("whose load reports reach the rule: 'rank' (each rank's own, as the rule "
                "is designed) or 'none' (no report: the rule's fallback, which is what "
                "smg 1.9's HTTP poll of a --dp-aware rank URL 'base@rank' gets by our "
                "reading of monitor.rs; see docs/core.md)")


@dataclass(frozen=True, slots=True)
class SmgPowerOfTwoOptions(Options):
    load_refresh_s: float = option(10.0, ge=0, doc=_REFRESH_DOC)
    bind: Bind = option("slot", doc=BIND_DOC)
    load_reports: Literal["rank", "none"] = option("rank", doc=_REPORTS_DOC)


@register_policy("smg_power_of_two")
class SmgPowerOfTwo(_Polled[SmgPowerOfTwoOptions]):
    """``power_of_two`` (power_of_two.rs): two distinct ranks drawn uniformly; the one
    with the lower polled KV use wins, the first drawn on a tie. smg 1.9 compares
    the token-usage ratio (used / capacity), sglang-router 0.3.2 the absolute
    ``num_tokens`` of ``/get_load`` polled every 30 s (``--worker-startup-check-
    interval``): the same order on equal ranks. Nothing is added between polls, so a
    whole poll interval's arrivals follow the same stale order. Without a report for
    either rank both fall back to the router's in-flight request counts."""

    Options = SmgPowerOfTwoOptions

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        if len(feasible) == 1:
            return feasible[0]
        n = len(feasible)
        i = int(self.context.rng.integers(n))
        j = (i + 1 + int(self.context.rng.integers(n - 1))) % n
        a, b = feasible[i], feasible[j]
        if self.options.load_reports == "none":
            la, lb = float(led.running[a]), float(led.running[b])
        else:
            la, lb = self._usage(a, led), self._usage(b, led)
        return a if la <= lb else b

    def _usage(self, g: int, led: Ledger) -> float:
        lim = led.kv_limit[g]
        used = float(self.poll.used_tokens[g])
        return used / lim if lim < UNLIMITED_TOKENS else used


@dataclass(frozen=True, slots=True)
class LeastLoadOptions(Options):
    load_refresh_s: float = option(10.0, ge=0, doc=_REFRESH_DOC)
    bind: Bind = option("slot", doc=BIND_DOC)
    kv_pressure_weight: float = option(0.15, ge=0, doc="seconds weighting k/(1-k) of "
                                       "the rank's KV use k (smg default 0.15)")
    mean_prefill_tokens: int = option(1024, ge=1, doc="tokens credited per request "
                                      "dispatched since the last poll when the router "
                                      "does not know its length (HTTP; default 1024)")
    default_throughput: float = option(2000.0, gt=0, doc="tokens/s assumed for a rank "
                                       "reporting no decode rate (default 2000)")
    least_load_tokens: Literal["mean", "prompt"] = option(
        "mean", doc="what a dispatch adds to the rank's in-flight work: 'mean' "
        "(mean_prefill_tokens, the HTTP path) or 'prompt' (its prompt's tokens, the gRPC "
        "path, which knows them)")
    load_reports: Literal["rank", "none"] = option("rank", doc=_REPORTS_DOC)
    kv_capacity_tokens: int | None = option(
        None, ge=1, doc="a rank's KV pool in tokens as its engine reports it "
        "(max_total_num_tokens), for the KV use k = used / capacity; None: the simulated "
        "rank's KV limit, so no KV term without --kv-limit (a real engine always has one)")


@register_policy("smg_least_load")
class SmgLeastLoad(_Polled[LeastLoadOptions]):
    """``least_load`` (least_load.rs): argmin over ranks of
    ``(queued + in_flight) / throughput + w * k / (1 - k)``, ties to the first rank.
    ``queued``: the rank's waiting-queue tokens from the poll (0 here: a simulated rank
    has no waiting queue, the router-side pool holds what waits); ``in_flight``: tokens
    dispatched to the rank since its last poll (reset by each poll);
    ``throughput``: the rank's polled decode rate (``default_throughput`` when 0);
    ``k``: its polled KV use, clamped to 0.999. With no report at all it is JSQ on the
    router's live in-flight request counts. Without a KV term (no KV capacity) every
    score is 0 right after a poll, so the first request after each poll goes to the
    lowest rank whatever its load (the real rule's tie-break)."""

    Options = LeastLoadOptions

    def polled(self, cluster: ClusterSnapshot, now_s: float) -> None:
        if self.poll.refresh(cluster, now_s):
            self._inflight = [0.0] * cluster.num_replicas

    def choose(self, req: PoolRequest, feasible: list[int], led: Ledger) -> int:
        o = self.options
        if o.load_reports == "none":
            return min(feasible, key=lambda g: (led.running[g], g))
        p = self.poll
        cap = o.kv_capacity_tokens

        def score(g: int) -> tuple[float, int]:
            thr = p.gen_tok_s[g] if p.gen_tok_s[g] > 0 else o.default_throughput
            k = min(max(p.kv_usage[g] if cap is None else p.used_tokens[g] / cap, 0.0),
                    0.999)
            return self._inflight[g] / thr + o.kv_pressure_weight * k / (1.0 - k), g

        g = min(feasible, key=score)
        self._inflight[g] += (req.prompt_tokens if o.least_load_tokens == "prompt"
                              else o.mean_prefill_tokens)
        return g
