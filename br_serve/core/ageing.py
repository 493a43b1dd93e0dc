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


class _Steps:
    """A non-decreasing step series: ``keys[i]`` was first reached at ``values[i]``.

    One shape serves the release count, the released prompt tokens and the entry count
    (there the value is the oldest pool request's arrival). Keys below ``start`` are
    no longer needed and are dropped in bulk once they are most of the list."""

    __slots__ = ("keys", "start", "values")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.values: list[float] = []
        self.start = 0

    def grows(self, key: int) -> bool:
        return not self.keys or key > self.keys[-1]

    def note(self, key: int, value: float) -> None:
        if self.grows(key):
            self.keys.append(key)
            self.values.append(value)

    def at(self, key: int) -> float | None:
        """The value where ``key`` was first reached (None: not yet)."""
        i = bisect_left(self.keys, key, self.start)
        return self.values[i] if i < len(self.keys) else None

    def forget_below(self, key: int | None) -> None:
        """No caller needs keys below ``key`` any more (None: only the last one)."""
        if key is None:
            self.start = max(0, len(self.keys) - 1)
        else:
            self.start = max(self.start, bisect_left(self.keys, key, self.start))
        if self.start > 1024 and self.start * 2 > len(self.keys):
            del self.keys[: self.start]
            del self.values[: self.start]
            self.start = 0


class Ageing:
    """The starving requests of a pool, and the release clock the FCFS rule needs.

    One instance per policy instance and pool: :meth:`starving` before a tick's
    stages, :meth:`record` with the tick's assignment count after them. State changes
    only there.
    """

    __slots__ = ("_entries", "_releases", "_tokens", "rule")

    def __init__(self, rule: AgeingRule) -> None:
        self.rule = rule
        self._releases = _Steps()  # release count -> when it was reached
        self._tokens = _Steps()  # released prompt tokens -> when (prompt_clock)
        # entry count -> the oldest pool request's arrival at the tick that first saw it
        self._entries = _Steps()

    def tokens_released_at(self, tokens: int) -> float | None:
        """When the pool's released prompt tokens first reached ``tokens`` (None: not
        yet, or ``prompt_clock`` is off)."""
        return self._tokens.at(tokens)

    def head_arrival_at_entry(self, rank: int) -> float | None:
        """Arrival time of the oldest pool request at the first tick that saw the
        request of entry rank ``rank`` (None: not recorded)."""
        return self._entries.at(rank + 1)

    def _note_entries(self, pool: PromptPool) -> None:
        entered = pool.released + len(pool)
        if len(pool) and self._entries.grows(entered):
            self._entries.note(entered, next(pool.fcfs()).arrival_s)

    def released_at(self, count: int) -> float | None:
        """When the pool's release count first reached ``count`` (None: not yet)."""
        return self._releases.at(count)

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
        self._releases.note(released, now_s)  # releases made outside this policy's ticks
        tokens = r.prompt_clock
        if tokens:
            self._tokens.note(pool.released_tokens, now_s)
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
        self._releases.note(pool.released + assigned, now_s)
        oldest = next(pool.fcfs(), None)
        if self.rule.prompt_clock:
            self._tokens.note(pool.released_tokens + assigned_tokens, now_s)
            self._tokens.forget_below(
                None if oldest is None else pool.tokens_through(oldest.request_id))
        head = pool.head_rank()
        self._releases.forget_below(None if head is None else head + 1)
        self._entries.forget_below(None if head is None else head + 1)
