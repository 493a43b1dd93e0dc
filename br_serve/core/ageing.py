"""Ageing: which pool requests a BalanceRoute tick must place first, in operator terms.

BalanceRoute reorders the pool (it picks prompts by size), so without a bound a prompt
that fits no margin can wait for ever. The fairness rule an operator states is a bound
on each request's **pool wait relative to FCFS**:

    pool wait  <=  fcfs_wait_factor x (its FCFS pool wait)  +  max_wait_beyond_fcfs_s

A request *starves* (is overdue) once its deadline (entry + factor x FCFS wait +
slack) has passed; overdue requests are placed first. Each carries its urgency, the
share of its slack it has used (1 at the deadline), so the tick can tell how overdue it
is: those about as overdue as the most overdue one compete by fit (the tick's
``overdue_band``), else each goes, oldest first, to its best-F replica. Its FCFS
pool wait is estimated online: its FCFS turn ``T_p`` is the moment the pool had released
as many requests as entered before it (FCFS would have released it next), and
:class:`Ageing` records when each release count was reached, so the FCFS wait is
``T_p - entered``. Until the turn comes the FCFS wait is at least ``now - entered``
and the request cannot be past its deadline.

**Prompt-token clock** (``prompt_clock``). The release count is FCFS's clock only if the
policy releases requests as fast as FCFS would, and it does not: BalanceRoute picks
prompts by size, so in a long saturated run it admits other requests than FCFS (on
ServeGen R1, large prompts with long outputs first: its release count ran 30-40% behind
FCFS's a third of the way through 4,000 requests), the turns it reads come late, and the
factor doubles the error (docs/core.md, "Longer runs"). With ``prompt_clock`` a
request's turn is the earlier of that moment and the moment the pool had released as
many prompt tokens as entered up to and including it (FCFS releases the same prompts in
order, so it had released exactly that many by the request's turn). A policy that takes
large prompts first runs ahead on this clock, one that takes small ones on the count:
the earlier of the two is the tighter bound either way. ``fcfs_wait_factor = 1`` is the absolute
rule "wait beyond FCFS at most ``max_wait_beyond_fcfs_s``" (the harness's ``T_q - T_p``).

Lead time: a request past ``soft_share`` of its slack (``(now - base) / slack`` with
``base = entered + factor x FCFS wait``) is placed first where it fits without
overflow, before its deadline forces it anywhere.

Why relative: in a deep pool (a backlog) every request waits long under FCFS too, and
the slot turnover that would serve an absolute 30 s budget is slower than the budgets
expire: the starving backlog grows, the tick degenerates to FCFS with an F-chosen
replica, and the bound is not kept either (docs/core.md, "Fairness"). A bound
proportional to the FCFS wait scales with the depth of the pool by itself, so the
same rule serves a deep pool (mostly BalanceRoute's order) and a shallow one (the FCFS
wait is near 0 and the slack is the bound); the user need not know which they have.

**TTFT budget** (``ttft_budget_s``): the request arrived (before its prefill) this many
seconds ago. With ``ttft_backlog_s`` set it binds only a request whose FCFS turn came
within that many seconds of its arrival: online traffic, where FCFS would have started
it soon and a latency SLO is at stake. A request FCFS would have kept waiting longer is
backlog work (a deep pool, where every request misses a small budget under FCFS too);
only the relative rule binds it, so a backlog keeps BalanceRoute's order. Without
``ttft_backlog_s`` the budget binds every request (a deep pool then degenerates to FCFS
order once its requests pass the budget).

**Queue age** (``ttft_queue_age_factor``, with ``ttft_backlog_s``): one number of
seconds cannot tell a short backlog from an at-capacity queue: a batch of short
requests submitted at once (a saturated pool) drains within seconds, so many FCFS turns
come within ``ttft_backlog_s`` of the common arrival, and the budget would put the batch
in FCFS order. What differs is how fast the queue ahead of the request *formed*. At
capacity it builds up from arrivals spread over time: the oldest pool request when the
request entered had waited about as long as the request's own FCFS wait. In a burst it
formed at once: the oldest request arrived with it (age 0). So the budget binds only a
request whose FCFS wait (``T_p - arrival``) is at most ``ttft_queue_age_factor`` x
that age (``arrival - the oldest pool request's arrival``, read at the first tick that
saw the request); a request FCFS would have started at its arrival (wait 0) is online
either way, and so is one FCFS would have started within ``ttft_online_wait_s`` of its
arrival (online traffic arrives in clumps: a dozen requests at one instant into an
empty pool have a queue age of 0, yet FCFS starts them within seconds; without this
floor the test took them for a batch and left them to BalanceRoute's order, the tail
of TTFT at capacity). Online: pool contents at the tick, no oracle.

Deadlines grow along the pool's FCFS order when requests enter in one batch (a
saturated pool) or with ``factor = 1``; otherwise a later entry can fall due first and
is reached once those ahead of it are placed (the scan stops at the first request no
rule marks, after looking ``soft_scan`` requests further). Releases the policy did not
make (cancellations, failed dispatches put back) are dated at the next tick, which can
only make a wait look shorter.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

from br_serve.core.pool import PromptPool
from br_serve.core.types import PoolRequest


@dataclass(frozen=True, slots=True)
class AgeingRule:
    """The ageing budgets (``None``: the rule is off); see the module."""

    max_wait_beyond_fcfs_s: float | None = None
    ttft_budget_s: float | None = None
    soft_share: float = 0.5
    soft_scan: int = 64
    fcfs_wait_factor: float = 1.0
    ttft_backlog_s: float | None = None
    ttft_queue_age_factor: float | None = None
    ttft_online_wait_s: float | None = None
    prompt_clock: bool = False


def _share(waited_s: float, budget_s: float) -> float:
    if budget_s <= 0:
        return float("inf") if waited_s >= 0 else -1.0
    return waited_s / budget_s


class Ageing:
    """The starving requests of a pool, and the release clock the FCFS rule needs.

    One instance per policy instance and pool: :meth:`starving` before a tick's
    stages, :meth:`record` with the tick's assignment count after them. State changes
    only there.
    """

    __slots__ = ("_counts", "_entered", "_head_arrival", "_hstart", "_start", "_times",
                 "_tok_counts", "_tok_start", "_tok_times", "rule")

    def __init__(self, rule: AgeingRule) -> None:
        self.rule = rule
        # release breakpoints: the pool's release count reached _counts[i] at _times[i]
        self._counts: list[int] = []
        self._times: list[float] = []
        self._start = 0  # entries before it are no longer needed
        # entry breakpoints: at the tick the pool's entry count first reached
        # _entered[i], its oldest request had arrived at _head_arrival[i]
        self._entered: list[int] = []
        self._head_arrival: list[float] = []
        self._hstart = 0
        # prompt_clock: the pool's released prompt tokens reached _tok_counts[i] at
        # _tok_times[i]
        self._tok_counts: list[int] = []
        self._tok_times: list[float] = []
        self._tok_start = 0

    def tokens_released_at(self, tokens: int) -> float | None:
        """When the pool's released prompt tokens first reached ``tokens`` (None: not
        yet, or ``prompt_clock`` is off)."""
        i = bisect_left(self._tok_counts, tokens, self._tok_start)
        return self._tok_times[i] if i < len(self._tok_counts) else None

    def _note_tokens(self, tokens: int, now_s: float) -> None:
        if not self._tok_counts or tokens > self._tok_counts[-1]:
            self._tok_counts.append(tokens)
            self._tok_times.append(now_s)

    def head_arrival_at_entry(self, rank: int) -> float | None:
        """Arrival time of the oldest pool request at the first tick that saw the
        request of entry rank ``rank`` (None: not recorded)."""
        i = bisect_left(self._entered, rank + 1, self._hstart)
        return self._head_arrival[i] if i < len(self._entered) else None

    def _note_entries(self, pool: PromptPool) -> None:
        entered = pool.released + len(pool)
        if len(pool) and (not self._entered or entered > self._entered[-1]):
            head = next(pool.fcfs())
            self._entered.append(entered)
            self._head_arrival.append(head.arrival_s)

    def released_at(self, count: int) -> float | None:
        """When the pool's release count first reached ``count`` (None: not yet)."""
        i = bisect_left(self._counts, count, self._start)
        return self._times[i] if i < len(self._counts) else None

    def _note(self, count: int, now_s: float) -> None:
        if not self._counts or count > self._counts[-1]:
            self._counts.append(count)
            self._times.append(now_s)

    def starving(self, pool: PromptPool, now_s: float, tick: int
                 ) -> Iterator[tuple[PoolRequest, float]]:
        """``(request, urgency)`` of the starving requests, oldest first (lazy: a tick
        stops when its slots run out). ``urgency``: the largest share of a budget the
        request has used; >= 1: overdue, past a budget (place it now); else past
        ``soft_share`` of one (place it first where it fits; at most ``soft_scan``)."""
        r = self.rule
        fcfs, ttft = r.max_wait_beyond_fcfs_s, r.ttft_budget_s
        if fcfs is None and ttft is None:
            return
        kappa = r.ttft_queue_age_factor
        if kappa is not None:
            self._note_entries(pool)
        released = pool.released
        self._note(released, now_s)  # releases made outside this policy's ticks
        tokens = r.prompt_clock
        if tokens:
            self._note_tokens(pool.released_tokens, now_s)
        soft_left = r.soft_scan
        factor = r.fcfs_wait_factor
        look = r.soft_scan if factor != 1.0 else 0  # deadlines may not grow along FCFS
        backlog = r.ttft_backlog_s
        for req, rank, _overtaken in pool.fcfs_ranks():
            by_tokens = (self.tokens_released_at(pool.tokens_through(req.request_id))
                         if tokens else None)
            if (ttft is None or backlog is not None) and released <= rank \
                    and by_tokens is None:
                return  # its FCFS turn has not come, nor that of any later entry
            wait = -1.0  # the largest share of a budget the request has used
            turn = self.released_at(rank + 1) if released > rank else None
            if by_tokens is not None:  # the earlier clock (module: prompt-token clock)
                turn = by_tokens if turn is None else min(turn, by_tokens)
            if fcfs is not None and turn is not None:
                base = req.enqueued_s + factor * (turn - req.enqueued_s)
                wait = _share(now_s - base, fcfs)
            if ttft is not None and (backlog is None or (
                    turn is not None and turn - req.arrival_s <= backlog
                    and self._queued_online(req, rank, turn, kappa))):
                wait = max(wait, _share(now_s - req.arrival_s, ttft))
            if wait >= 1.0:
                yield req, wait
            elif wait >= r.soft_share and r.soft_share < 1.0 and soft_left > 0:
                soft_left -= 1
                yield req, wait
            elif look > 0:
                look -= 1
            else:
                return

    def _forget_tokens(self, pool: PromptPool) -> None:
        """Drop token breakpoints below the oldest pool request's (none needs them)."""
        head = next(pool.fcfs(), None)
        if head is None:
            self._tok_start = max(0, len(self._tok_counts) - 1)
        else:
            self._tok_start = max(self._tok_start, bisect_left(
                self._tok_counts, pool.tokens_through(head.request_id), self._tok_start))
        if self._tok_start > 1024 and self._tok_start * 2 > len(self._tok_counts):
            del self._tok_counts[: self._tok_start]
            del self._tok_times[: self._tok_start]
            self._tok_start = 0

    def _queued_online(self, req: PoolRequest, rank: int, turn: float,
                       kappa: float | None) -> bool:
        """Whether the queue ahead of ``req`` formed slowly enough for online work:
        its FCFS wait is at most ``kappa`` x the age of the oldest pool request when it
        entered (a burst builds a queue much faster than the cluster drains it)."""
        if kappa is None:
            return True
        floor = self.rule.ttft_online_wait_s
        if floor is not None and turn - req.arrival_s <= floor:
            return True  # FCFS would have started it this soon: online, clump or not
        head = self.head_arrival_at_entry(rank)
        if head is None:
            return True  # no record (not expected): no evidence of a burst
        age = max(0.0, req.arrival_s - head)
        return turn - req.arrival_s <= kappa * age

    def record(self, pool: PromptPool, assigned: int, now_s: float,
               assigned_tokens: int = 0) -> None:
        """The tick released ``assigned`` requests with ``assigned_tokens`` prompt
        tokens at ``now_s`` (the caller removes them from the pool next; without the
        tokens, the prompt-token clock dates them at the next tick); forget breakpoints
        no pool request can need."""
        self._note(pool.released + assigned, now_s)
        if self.rule.prompt_clock:
            self._note_tokens(pool.released_tokens + assigned_tokens, now_s)
            self._forget_tokens(pool)
        head = pool.head_rank()
        if head is None:
            self._start = len(self._counts) - 1 if self._counts else 0
        else:
            self._start = max(self._start, bisect_left(self._counts, head + 1, self._start))
        if self._entered:
            h = len(self._entered) - 1 if head is None else bisect_left(
                self._entered, head + 1, self._hstart)
            self._hstart = max(self._hstart, h)
            if self._hstart > 1024 and self._hstart * 2 > len(self._entered):
                del self._entered[: self._hstart]
                del self._head_arrival[: self._hstart]
                self._hstart = 0
        if self._start > 1024 and self._start * 2 > len(self._counts):
            del self._counts[: self._start]
            del self._times[: self._start]
            self._start = 0
