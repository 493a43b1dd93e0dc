"""Ageing: which pool requests a BalanceRoute tick must place first, in operator terms.

BalanceRoute reorders the pool (it picks prompts by size), so without a bound a prompt
that fits no margin can wait for ever. The fairness rule an operator states is a bound
on each request's **pool wait relative to FCFS**:

    pool wait  <=  fcfs_wait_factor x (its FCFS pool wait)  +  max_wait_beyond_fcfs_s

A request *starves* once its deadline (entry + factor x FCFS wait + slack) has passed;
starving requests are placed first, oldest first, each on its best-F replica. Its FCFS
pool wait is estimated online: its FCFS turn ``T_p`` is the moment the pool had released
as many requests as entered before it (FCFS would have released it next), and
:class:`Ageing` records when each release count was reached, so the FCFS wait is
``T_p - entered``. Until the turn comes the FCFS wait is at least ``now - entered``
and the request cannot be past its deadline. ``fcfs_wait_factor = 1`` is the absolute
rule "wait beyond FCFS at most ``max_wait_beyond_fcfs_s``" (the harness's ``T_q - T_p``).

Lead time: a request past ``soft_share`` of its slack (``(now - base) / slack`` with
``base = entered + factor x FCFS wait``) is placed first where it fits without
overflow, before its deadline forces it anywhere.

**Slot-wait lead** (``slot_wait_lead``): being first in line is not being placed: a
request forced at its deadline still waits for a free slot, and with long outputs
slots free slowly while many late requests queue for them (the bound was missed by
minutes on long-output workloads that way). So the rule acts early by the expected
wait for its slot: the ``k``-th request of the scan whose FCFS turn has come (``k - 1``
such requests ahead of it, every one due no later in a saturated pool) counts as
``slot_wait_lead x k x (mean time between the pool's releases)`` seconds later than
``now`` (both phases shift). The lead grows along the scan, so a later request can be
urgent while those ahead of it are not: every request ahead of an urgent one is then
placed first too (they come before it, oldest first), and the scan reads every request
whose turn has come. A request FCFS would release at this tick (its rank below
``released + free_slots``) has its turn *now*: skipped, it waits for a later slot.
The mean is measured over the last releases (up to ``_RATE_WINDOW`` breakpoints, up to
``now``; releases at one instant count as one breakpoint, so the burst that fills an
empty cluster is not a rate); before any release after the first instant it is
unknown and taken as unbounded.

**Cold start** (``cold_start``): the same unknown, alone. Until the pool has released
after its first instant, a request FCFS would release at this tick is placed first (a
cold cluster's first tick is FCFS in *which* requests, BalanceRoute's in *where*). A
saturated start fills every slot at once; a request skipped then waits for the first
end, which with long outputs comes after any small slack: that start-up burst was the
whole P99 excess of the 2 x + 30 s rule on ServeGen R1 (docs/core.md).

Why relative: in a deep pool (a backlog) every request waits long under FCFS too, and
the slot turnover that would serve an absolute 30 s budget is slower than the budgets
expire: the starving backlog grows, the tick degenerates to FCFS with an F-chosen
replica, and the bound is not kept either (docs/core.md, "Fairness"). A bound
proportional to the FCFS wait scales with the depth of the pool by itself, so the
same rule serves a deep pool (mostly BalanceRoute's order) and a shallow one (the FCFS
wait is near 0 and the slack is the bound); the user need not know which they have.

**TTFT budget** (``ttft_budget_s``, off by default): the request arrived (before its
prefill) this many seconds ago; for latency-bound, shallow-pool deployments.

Deadlines grow along the pool's FCFS order when requests enter in one batch (a
saturated pool) or with ``factor = 1``; otherwise a later entry can fall due first and
is reached once those ahead of it are placed (the scan stops at the first request no
rule marks, after looking ``soft_scan`` requests further). Releases the policy did not
make (cancellations, failed dispatches put back) are dated at the next tick, which can
only make a wait look shorter.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
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
    slot_wait_lead: float = 0.0
    cold_start: bool = False


#: release breakpoints the slot-wait lead measures the release interval over
_RATE_WINDOW = 64


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

    __slots__ = ("_counts", "_recent", "_start", "_times", "rule")

    def __init__(self, rule: AgeingRule) -> None:
        self.rule = rule
        # release breakpoints: the pool's release count reached _counts[i] at _times[i]
        self._counts: list[int] = []
        self._times: list[float] = []
        self._start = 0  # entries before it are no longer needed
        # the last release breakpoints (time, count): the slot-wait lead's release rate
        self._recent: deque[tuple[float, int]] = deque(maxlen=_RATE_WINDOW)

    def released_at(self, count: int) -> float | None:
        """When the pool's release count first reached ``count`` (None: not yet)."""
        i = bisect_left(self._counts, count, self._start)
        return self._times[i] if i < len(self._counts) else None

    def _note(self, count: int, now_s: float) -> None:
        if not self._counts or count > self._counts[-1]:
            self._counts.append(count)
            self._times.append(now_s)
            recent = self._recent
            if recent and recent[-1][0] >= now_s:
                recent[-1] = (recent[-1][0], count)  # one instant, one breakpoint
            else:
                recent.append((now_s, count))

    def release_interval_s(self, now_s: float) -> float:
        """Mean seconds between the pool's releases over the recent breakpoints, the
        time since the last one included (inf: no release after the first instant)."""
        if len(self._recent) < 2:
            return float("inf")
        t0, c0 = self._recent[0]
        n = self._recent[-1][1] - c0
        return max(0.0, now_s - t0) / n

    @property
    def cold(self) -> bool:
        """No release after the pool's first instant yet (the slot wait is unknown)."""
        return len(self._recent) < 2

    def needs_free_slots(self) -> bool:
        """Whether :meth:`starving` reads the tick's free slots (a cold pool, or the
        slot-wait lead); else the caller may pass 0 and skip counting them."""
        r = self.rule
        return r.max_wait_beyond_fcfs_s is not None and (
            r.slot_wait_lead > 0 or (r.cold_start and self.cold))

    def starving(self, pool: PromptPool, now_s: float, tick: int, free_slots: int = 0
                 ) -> Iterator[tuple[PoolRequest, bool]]:
        """``(request, hard)`` of the starving requests, oldest first (lazy: a tick
        stops when its slots run out). ``hard``: past a budget (place it now); else past
        ``soft_share`` of one (place it first where it fits; at most ``soft_scan``).
        ``free_slots``: the tick's free slots (where :meth:`needs_free_slots`: the
        requests FCFS would release now have their turn now)."""
        r = self.rule
        fcfs, ttft = r.max_wait_beyond_fcfs_s, r.ttft_budget_s
        if fcfs is None and ttft is None:
            return
        released = pool.released
        self._note(released, now_s)  # releases made outside this policy's ticks
        soft_left = r.soft_scan
        factor = r.fcfs_wait_factor
        look = r.soft_scan if factor != 1.0 else 0  # deadlines may not grow along FCFS
        # slot-wait lead: the k-th request past its FCFS turn waits ~k release intervals
        step_s, due = 0.0, released  # ranks below ``due`` have had their turn
        cold = fcfs is not None and r.cold_start and self.cold
        if fcfs is not None and (r.slot_wait_lead > 0 or cold):
            due += free_slots
            if r.slot_wait_lead > 0:
                step_s = r.slot_wait_lead * self.release_interval_s(now_s)
        lead_s = 0.0
        lead = step_s > 0
        # with the lead: the due requests scanned since the last urgent one, and whether
        # each is soft; an urgent one makes every request ahead of it hard (EDF: they
        # are placed before it, oldest first)
        pending: list[tuple[PoolRequest, bool]] = []
        for req, rank, _overtaken in pool.fcfs_ranks():
            is_due = due > rank
            if ttft is None and not is_due:
                break  # its FCFS turn has not come, nor that of any later entry
            wait = -1.0  # the largest share of a budget the request has used
            if fcfs is not None and is_due:
                lead_s += step_s
                turn = now_s if released <= rank else self.released_at(rank + 1)
                if cold and released <= rank:
                    wait = float("inf")  # a cold pool: a later slot's wait is unknown
                elif turn is not None:
                    base = req.enqueued_s + factor * (turn - req.enqueued_s)
                    wait = _share(now_s + lead_s - base, fcfs)
            if ttft is not None:
                wait = max(wait, _share(now_s - req.arrival_s, ttft))
            if wait >= 1.0:
                for ahead, _soft in pending:
                    yield ahead, True
                pending.clear()
                yield req, True
            elif wait >= r.soft_share and r.soft_share < 1.0 and soft_left > 0:
                soft_left -= 1
                if lead and is_due:
                    pending.append((req, True))
                else:
                    yield req, False
            elif lead and is_due:
                pending.append((req, False))  # an urgent one further on may need it
            elif look > 0:
                look -= 1
            else:
                break
        for req, soft in pending:
            if soft:
                yield req, False

    def record(self, pool: PromptPool, assigned: int, now_s: float) -> None:
        """The tick released ``assigned`` requests at ``now_s`` (the caller removes
        them from the pool next); forget breakpoints no pool request can need."""
        self._note(pool.released + assigned, now_s)
        head = pool.head_rank()
        if head is None:
            self._start = len(self._counts) - 1 if self._counts else 0
        else:
            self._start = max(self._start, bisect_left(self._counts, head + 1, self._start))
        if self._start > 1024 and self._start * 2 > len(self._counts):
            del self._counts[: self._start]
            del self._times[: self._start]
            self._start = 0
