"""Ageing: which pool requests a BalanceRoute tick must place first, in operator terms.

BalanceRoute reorders the pool (it picks prompts by size), so without a bound a prompt
that fits no margin can wait for ever. Three rules, any of which makes a request
*starve* (it is then placed first, oldest first, each on its best-F replica):

- **wait beyond FCFS** (``max_wait_beyond_fcfs_s``, the default rule): the request's
  FCFS turn passed more than this many seconds ago. Its FCFS turn is the moment the
  pool had released as many requests as entered before it (FCFS would have released
  it next); :class:`Ageing` records when each release count was reached, so the
  wait beyond FCFS of a waiting request is ``now - T_p`` with ``p`` its entry rank.
  This is exactly the replay harness's "wait beyond FCFS" (``T_q - T_p``), bounded by
  the budget plus the wait for the next free slot. It does not fire merely because
  the pool is deep (every request of a saturated pool waits long; FCFS's wait is not
  BalanceRoute's doing).
- **TTFT budget** (``ttft_budget_s``, off by default): the request arrived (before its
  prefill) this many seconds ago. In a deep pool every request exceeds any small
  budget, and the rule then turns the tick into FCFS with an F-chosen replica: it is
  meant for latency-bound, shallow-pool deployments.
- **overtakes** (the earlier rule, off by default: ``max_overtakes=None``): waited
  longer than ``max_wait_s`` or ``max_wait_ticks`` *and* overtaken by at least
  ``max_overtakes`` newer requests.

Each rule only weakens along the pool's FCFS order (entry ranks and release times grow;
pool order is entry order), so the scan stops at the first request no rule marks; for
the TTFT budget this is exact when requests enter the pool in arrival order (a request
whose prefill overtook an earlier arrival's is reached once those ahead of it are
placed). Releases the policy did not make (cancellations, failed dispatches put back)
are dated at the next tick, which can only make a wait look shorter.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

from br_serve.core.pool import PromptPool
from br_serve.core.types import PoolRequest


@dataclass(frozen=True, slots=True)
class AgeingRule:
    """The three ageing rules' budgets (``None``: the rule is off); see the module."""

    max_wait_beyond_fcfs_s: float | None = None
    ttft_budget_s: float | None = None
    max_overtakes: int | None = None
    max_wait_s: float = 2.0
    max_wait_ticks: int = 32
    soft_share: float = 0.5
    soft_scan: int = 64


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

    __slots__ = ("_counts", "_start", "_times", "rule")

    def __init__(self, rule: AgeingRule) -> None:
        self.rule = rule
        # release breakpoints: the pool's release count reached _counts[i] at _times[i]
        self._counts: list[int] = []
        self._times: list[float] = []
        self._start = 0  # entries before it are no longer needed

    def released_at(self, count: int) -> float | None:
        """When the pool's release count first reached ``count`` (None: not yet)."""
        i = bisect_left(self._counts, count, self._start)
        return self._times[i] if i < len(self._counts) else None

    def _note(self, count: int, now_s: float) -> None:
        if not self._counts or count > self._counts[-1]:
            self._counts.append(count)
            self._times.append(now_s)

    def starving(self, pool: PromptPool, now_s: float, tick: int
                 ) -> Iterator[tuple[PoolRequest, bool]]:
        """``(request, hard)`` of the starving requests, oldest first (lazy: a tick
        stops when its slots run out). ``hard``: past a budget (place it now); else past
        ``soft_share`` of one (place it first where it fits; at most ``soft_scan``)."""
        r = self.rule
        fcfs, ttft = r.max_wait_beyond_fcfs_s, r.ttft_budget_s
        if fcfs is None and ttft is None and r.max_overtakes is None:
            return
        released = pool.released
        self._note(released, now_s)  # releases made outside this policy's ticks
        soft_left = r.soft_scan
        for req, rank, overtaken in pool.fcfs_ranks():
            wait = -1.0  # the largest share of a budget the request has used
            if fcfs is not None and released > rank:
                turn = self.released_at(rank + 1)
                if turn is not None:
                    wait = _share(now_s - turn, fcfs)
            if ttft is not None:
                wait = max(wait, _share(now_s - req.arrival_s, ttft))
            hard = wait >= 1.0
            if not hard and r.max_overtakes is not None:
                hard = overtaken >= r.max_overtakes and (
                    now_s - req.enqueued_s >= r.max_wait_s
                    or tick - req.enqueued_tick >= r.max_wait_ticks)
            if hard:
                yield req, True
            elif wait >= r.soft_share and r.soft_share < 1.0 and soft_left > 0:
                soft_left -= 1
                yield req, False
            else:
                return

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
