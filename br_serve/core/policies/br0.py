"""BR-0: the prediction-free BalanceRoute policy (docs/design.md, "BR-0")."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from typing import Literal

import numpy as np

from br_serve.core.ageing import Ageing, AgeingRule
from br_serve.core.fscore import f_score
from br_serve.core.options import Options, option
from br_serve.core.policy import PolicyBase, PolicyContext, PolicyNeeds, register_policy
from br_serve.core.pool import PromptPool
from br_serve.core.tick import MarginModel, run_two_stage
from br_serve.core.timecost import TimeMargins, homogeneous_tokens, stragglers_to_idle
from br_serve.core.types import ClusterSnapshot, FloatArray, TickResult


@dataclass(frozen=True, slots=True)
class TickOptions(Options):
    """Options of the two-stage tick, shared by BR-0 and BR-H (each extends them).

    Fairness (:mod:`br_serve.core.ageing`): a pool request is placed first once its
    pool wait reaches ``fcfs_wait_factor`` x its FCFS pool wait +
    ``max_wait_beyond_fcfs_s``, or it arrived ``ttft_budget_s`` ago and is not backlog
    work (its FCFS turn came within ``ttft_budget_backlog_s`` of its arrival, and within
    ``ttft_budget_queue_age_factor`` x the age of the queue it joined or within the
    budget itself). ``None`` turns a rule off.
    """

    s_greedy: int | None = option(
        None, ge=0, doc="Stage 1 runs while more than this many slots are free "
        "(None: the number of alive replicas G)")
    r_max: int = option(4, ge=1, le=10, doc="Stage 2 candidates per replica (2^r_max - 1 "
                        "subsets are enumerated)")
    max_wait_beyond_fcfs_s: float | None = option(
        30.0, ge=0, doc="fairness slack: a request's pool wait is kept within "
        "fcfs_wait_factor x its FCFS pool wait + this many seconds (None: no bound)")
    fcfs_wait_factor: float = option(
        2.0, ge=1, doc="fairness factor: the bound's multiple of the request's FCFS pool "
        "wait (estimated online from the pool's release clock; 1: an absolute bound "
        "on the wait beyond FCFS)")
    ttft_budget_s: float | None = option(
        5.0, ge=0, doc="TTFT budget: place a request first once it arrived this many "
        "seconds ago, if it is not backlog work (ttft_budget_backlog_s; None: off)")
    ttft_budget_backlog_s: float | None = option(
        15.0, ge=0, doc="the TTFT budget binds only a request whose FCFS turn (on the "
        "pool's release clock) came within this many seconds of its arrival; later ones "
        "are backlog work, bound by the relative rule only (None: it binds every request)")
    ttft_budget_queue_age_factor: float | None = option(
        4.0, ge=0, doc="with ttft_budget_backlog_s, the TTFT budget binds a request only "
        "if its FCFS wait is at most this multiple of the age of the oldest pool request "
        "when it entered: a queue that formed in a burst (a batch arriving at once) is "
        "backlog work, however soon it drains; one FCFS would have started within the "
        "TTFT budget is online either way (arrivals come in clumps; None: no such test)")
    ageing_soft_share: float = option(
        0.25, ge=0, le=1, doc="fairness lead time: a request past this share of its "
        "slack (or TTFT budget) is placed first where it fits without overflow (1: off)")
    ageing_soft_fill: float = option(
        0.5, ge=0, le=1, doc="ageing: such a request is placed first only where it fills "
        "at least this share of the replica's margin (its peak)")
    ageing_overdue_band: float | None = option(
        0.25, ge=0, doc="ageing: overdue requests within this share of a budget of the "
        "most overdue one go first by fit (the best F over every open replica), not "
        "oldest first: each has missed its deadline already, and placing them by fit "
        "frees the next slots sooner (None: oldest first, each to its best-F replica)")
    ageing_prompt_clock: bool = option(
        True, doc="fairness clock: a request's FCFS turn is the earlier of the moment "
        "the pool had released as many requests as entered before it and the moment it "
        "had released as many prompt tokens as entered up to it (False: the count "
        "alone, which drifts behind FCFS's where the policy admits long requests first)")
    shallow_pool: bool = option(
        True, doc="when every pool request fits the free slots, place each (largest "
        "first) on its best-F replica, ties to the least (projected) load")
    hold_budget_ms: float = option(
        2000.0, ge=0, doc="shallow pool: hold a request that would overflow every open "
        "replica (raise the barrier wherever it went) for up to this long since it "
        "entered the pool, for a placement that does not (0: never hold)")
    hold_min_busy_share: float = option(
        0.5, ge=0, le=1, doc="the hold applies only while the alive replicas are at "
        "least this busy (the larger of the running share of their slots and, where "
        "they have KV limits, the used share of their KV): at lighter load the step time "
        "it buys is not scarce and its TTFT cost is not worth paying (0: at any load)")
    hold_min_load_share: float = option(
        0.4, ge=0, le=1, doc="the hold applies only while the load terms (a_g L_g + "
        "c_g N_g) are at least this share of the longest modelled step (b_g the rest): "
        "where the fixed per-step cost dominates (few requests per replica, short "
        "contexts) balance moves the step little and the hold's TTFT buys nothing "
        "(0: at any share)")

    def resolved_s_greedy(self, replicas: int) -> int:
        return replicas if self.s_greedy is None else self.s_greedy

    def ageing_rule(self) -> AgeingRule:
        return AgeingRule(self.max_wait_beyond_fcfs_s, self.ttft_budget_s,
                          soft_share=self.ageing_soft_share,
                          fcfs_wait_factor=self.fcfs_wait_factor,
                          ttft_backlog_s=self.ttft_budget_backlog_s,
                          ttft_queue_age_factor=self.ttft_budget_queue_age_factor,
                          # FCFS would have started it within the budget: online work
                          ttft_online_wait_s=self.ttft_budget_s,
                          prompt_clock=self.ageing_prompt_clock)


@dataclass(frozen=True, slots=True)
class BR0Options(TickOptions):
    """The tick's options plus BR-0's time-aware stage (opt-in: ``cost="time"``)."""

    cost: Literal["tokens", "time"] = option(
        "tokens", doc="what the barrier balances: KV tokens (the paper), or each "
        "replica's modelled step time a_g L_g + c_g N_g + b_g in seconds")
    step_coefficients: Literal["calibrated", "configured"] = option(
        "calibrated", doc="with cost=time: the coefficients the driver fits online from "
        "measured steps, or the configured ones, fixed")
    idle_over_balanced: float | None = option(
        0.25, ge=0, doc="with cost=time on unequal replicas: a replica whose modelled step "
        "time exceeds the balanced step time of the cluster's load (water-filling) by "
        "more than this share gets no new request until it falls back (None: off, "
        "every free slot is filled)")

    straggler_prompt_quantile: float | None = option(
        0.5, ge=0, le=1, doc="with idle_over_balanced, in a deep pool: such a replica is "
        "not idled but takes only prompts up to this (lower) quantile of the pool's "
        "prompt lengths, the short requests that suit it (None: always idled)")
    straggler_cap_min_pool_share: float = option(
        0.25, ge=0, doc="the pool is deep (a straggler is capped, not idled) when it "
        "holds at least this share of the alive replicas' slots; in a shallower pool a "
        "straggler is idled, which keeps every step short (latency) where the deep "
        "pool's throughput is not at stake")
    queued_load: Literal["entry", "bound", "running"] = option(
        "entry", doc="with requests queued at the engines (dispatched ahead): the load "
        "each replica is balanced on: its load when a request bound now starts to "
        "decode (entry: the queued ones run by then, one running one per queued one "
        "and for the new one has left), every bound request's tokens (bound), or the "
        "running ones' only (running)")


class ScalarScorer:
    """``F(D) = D - G*(D - m)_+`` for one replica's margin ``m``; peaks at ``D = m``."""

    __slots__ = ("g", "peak")

    def __init__(self, margin: float, replicas: int) -> None:
        self.peak = margin
        self.g = replicas

    def __call__(self, d_tokens: float, n_requests: int = 1) -> float:
        return f_score(d_tokens, self.peak, self.g)


class ScalarMargins:
    """Replica loads now, the barrier max ``M`` over alive replicas, margins ``M - L_g``."""

    __slots__ = ("alive", "g", "loads", "max_load")

    def __init__(self, cluster: ClusterSnapshot, queued_load: str = "bound") -> None:
        self.loads: list[float] = balanced_loads(cluster, queued_load)[0].tolist()
        self.alive: list[bool] = cluster.alive.tolist()
        self.g = max(1, sum(self.alive))
        self.max_load = max(compress(self.loads, self.alive), default=0.0)

    def rank(self, g: int) -> float:
        return -self.loads[g]  # margin M - L_g, less the common M

    def scorer(self, g: int) -> ScalarScorer:
        return ScalarScorer(self.max_load - self.loads[g], self.g)

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None:
        self.loads[g] += d_tokens
        if self.loads[g] > self.max_load:
            self.max_load = self.loads[g]


def balanced_loads(cluster: ClusterSnapshot, queued_load: str) -> tuple[FloatArray,
                                                                          FloatArray]:
    """``(load_tokens, running_requests)`` per replica that br0 balances under
    ``queued_load`` (the same as the snapshot's when no engine queues)."""
    if queued_load == "entry":
        return cluster.entry_load_tokens(), cluster.entry_running_requests()
    if queued_load == "running" and cluster.queued_requests is not None:
        return (cluster.running_load_tokens().astype(np.float64),
                (cluster.running_requests - cluster.queued_requests).astype(np.float64))
    return (cluster.load_tokens.astype(np.float64),
            cluster.running_requests.astype(np.float64))


def calibrates(options: BR0Options) -> bool:
    """Whether ``options`` route on step costs the driver must fit online."""
    return options.cost == "time" and options.step_coefficients == "calibrated"


def scalar_model(cluster: ClusterSnapshot, options: BR0Options) -> MarginModel:
    """BR-0's margins in tokens, or in seconds with ``cost="time"`` (docs/design.md)."""
    if options.cost == "time" and not homogeneous_tokens(cluster):
        return TimeMargins(cluster, *balanced_loads(cluster, options.queued_load))
    return ScalarMargins(cluster, options.queued_load)


@register_policy("br0")
class BR0(PolicyBase[BR0Options]):
    """Two-stage F-score tick over scalar margins."""

    Options = BR0Options
    needs = PolicyNeeds()

    @classmethod
    def needs_for(cls, options: BR0Options) -> PolicyNeeds:
        return PolicyNeeds(calibrated_step_costs=calibrates(options))

    def __init__(self, options: BR0Options, context: PolicyContext) -> None:
        super().__init__(options, context)
        self.ageing = Ageing(options.ageing_rule())

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        c = self.options
        idle: set[int] = set()
        caps: dict[int, float] = {}
        if (c.cost == "time" and c.idle_over_balanced is not None
                and not homogeneous_tokens(cluster)):  # keeps the homogeneous identity
            idle = stragglers_to_idle(cluster, c.idle_over_balanced)
            q = c.straggler_prompt_quantile
            deep = len(pool) >= c.straggler_cap_min_pool_share * float(
                cluster.slots[cluster.alive].sum())
            if q is not None and idle and len(pool) and deep:
                sizes = pool.sorted_sizes
                cap = float(sizes[int(q * (len(sizes) - 1))])  # the lower q-quantile
                caps = dict.fromkeys(idle, cap)
                idle = set()
        res = run_two_stage(
            cluster, pool, scalar_model(cluster, c),
            s_greedy=c.resolved_s_greedy(cluster.num_replicas), r_max=c.r_max,
            starving=self.ageing.starving(pool, now_s, tick),
            soft_fill=c.ageing_soft_fill, overdue_band=c.ageing_overdue_band,
            shallow=c.shallow_pool,
            hold_budget_s=c.hold_budget_ms / 1e3, hold_min_busy_share=c.hold_min_busy_share,
            hold_min_load_share=c.hold_min_load_share, now_s=now_s, idle=idle,
            size_caps=caps)
        self.ageing.record(pool, len(res.assignments), now_s, sum(
            a.prompt_tokens for a in res.assignments))
        return res

