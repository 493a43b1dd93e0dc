"""DyntraLB's planner: which of each rank's requests run the next decode step.

Modelled from vllm-project/vllm-ascend commit 182b75ea (2026-08-22; the feature landed
in ffa55704, PR #12292): ``vllm_ascend/patch/platform/patch_dyntra_lb_core.py``
(``DyntraLBDPEngineCoreProc._balance_load``) and ``vllm_ascend/core/
dyntra_lb_scheduler.py`` (how a rank applies its plan); user guide
``docs/source/user_guide/feature_guide/dyntra_lb.md``.

Each rank of a decode node's internal DP group all-gathers, after every step, the KV
block counts of its running requests and of its admissible waiting ones (KV already
pulled; requests it paused earlier come first). Every rank runs the same planner on
that snapshot and applies its own row at the next step. The planner never moves a
request to another rank; it only changes which local requests run:

1. each rank with fewer running requests than ``max_running`` pulls waiting ones in,
   in order, until it is full or has none (these count as *newly added*);
2. while the bubble (``max - mean`` of the ranks' running blocks; with a threshold
   below 1, ``(max - mean) / max``) is at or above the threshold, up to ``max_iters``
   rounds: the least-loaded rank swaps one running request for one of its waiting ones
   that makes it heavier, the swap bringing its load closest to the new mean (only if
   closer than before; ties prefer pausing a newly added request); then the most
   loaded rank swaps to become lighter, likewise; if neither swapped, the most loaded
   rank pauses the running request whose removal most raises an estimated cluster
   throughput ``running requests / (20,000 + 19.2 x max blocks)`` (fixed constants in
   the code, microseconds), if any does; a round that changes nothing ends the loop;
3. per rank, the net change (a request paused and taken back in is in neither list);
   then a paused request and an admitted one of equal block count cancel out;
4. a rank whose plan admits nothing is *frozen*: it admits no waiting request next step.

Pure and deterministic: items keep their identities (the real scheduler maps the plan
back to requests by block count, preferring newly added ones; requests of equal block
count are interchangeable for the load it balances).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

#: the planner's step-latency estimate (microseconds), fixed in vllm-ascend's code
STEP_FIXED_US = 20000.0
STEP_PER_BLOCK_US = 19.2


@dataclass(slots=True)
class _Item:
    key: Hashable
    blocks: int
    newly_added: bool = False


@dataclass(slots=True)
class _Rank:
    index: int
    running: list[_Item]
    waiting: list[_Item]
    total: int = 0
    paused: list[_Item] = field(default_factory=list)
    admitted: list[_Item] = field(default_factory=list)
    was_running: list[_Item] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RankPlan:
    """One rank's plan for the next step: ``pause`` running requests (they keep their
    KV and wait), ``admit`` waiting ones, and ``freeze`` (admit nothing else)."""

    pause: tuple[Hashable, ...] = ()
    admit: tuple[Hashable, ...] = ()
    freeze: bool = True


def bubble(totals: Sequence[float], threshold: float) -> float:
    """``max - mean`` of ``totals`` (``(max - mean) / max`` for a threshold below 1)."""
    top = max(totals)
    mean = sum(totals) / len(totals)
    if threshold < 1:
        return (top - mean) / top if top > 0 else 0.0
    return top - mean


def plan(ranks: Sequence[tuple[Sequence[tuple[Hashable, int]], Sequence[tuple[Hashable, int]]]],
         threshold: float, max_running: int | None = None,
         max_iters: int = 1000) -> list[RankPlan]:
    """The plan of every rank, from ``(running, waiting)`` lists of ``(key, blocks)``
    per rank (waiting in admission order). See the module docstring.

    Raises:
        ValueError: no ranks, or a threshold <= 0.
    """
    if not ranks:
        raise ValueError("ranks: need at least one rank")
    if not threshold > 0:
        raise ValueError(f"threshold: must be > 0 (got {threshold})")
    cards = [_Rank(g, [_Item(k, b) for k, b in run], [_Item(k, b) for k, b in wait])
             for g, (run, wait) in enumerate(ranks)]
    for c in cards:
        c.total = sum(i.blocks for i in c.running)
        c.was_running = list(c.running)
        while max_running is not None and len(c.running) < max_running and c.waiting:
            item = c.waiting[0]
            item.newly_added = True
            _pull_in(c, item)
    n = len(cards)
    for _ in range(max_iters):
        cards.sort(key=lambda c: c.total, reverse=True)
        if bubble([c.total for c in cards], threshold) < threshold:
            break
        swapped = _swap(cards[-1], cards, n, heavier=True)
        if swapped:
            if bubble([c.total for c in cards], threshold) < threshold:
                break
            cards.sort(key=lambda c: c.total, reverse=True)
        swapped = _swap(cards[0], cards, n, heavier=False) or swapped
        dropped = not swapped and _drop(cards[0], cards)
        if bubble([c.total for c in cards], threshold) < threshold:
            break
        if not swapped and not dropped:
            break
    out = [RankPlan()] * n
    for c in cards:
        pause, admit = _cancel(*_net(c))
        out[c.index] = RankPlan(tuple(i.key for i in pause), tuple(i.key for i in admit),
                                freeze=not admit)
    return out


def _pull_in(c: _Rank, item: _Item) -> None:
    c.waiting.remove(item)
    c.running.append(item)
    c.admitted.append(item)
    c.total += item.blocks


def _swap(c: _Rank, cards: list[_Rank], n: int, heavier: bool) -> bool:
    """Best running <-> waiting swap on ``c`` toward the mean (see step 2)."""
    mean = sum(x.total for x in cards) / n
    best: tuple[_Item, _Item] | None = None
    best_dist = abs(c.total - mean)
    best_new = False
    for run in c.running:
        for wait in c.waiting:
            delta = wait.blocks - run.blocks
            if (delta <= 0) if heavier else (delta >= 0):
                continue
            dist = abs(c.total + delta - (mean + delta / n))
            if dist < best_dist or (dist == best_dist and run.newly_added and not best_new):
                best, best_dist, best_new = (run, wait), dist, run.newly_added
    if best is None:
        return False
    run, wait = best
    c.running.remove(run)
    c.waiting.remove(wait)
    c.running.append(wait)
    c.waiting.append(run)
    c.paused.append(run)
    c.admitted.append(wait)
    c.total += wait.blocks - run.blocks
    return True


def _drop(c: _Rank, cards: list[_Rank]) -> bool:
    """Pause the running request of the heaviest rank ``c`` whose removal most raises
    the estimated throughput, if one does."""
    total_reqs = sum(len(x.running) for x in cards)
    if total_reqs <= 1:
        return False
    second = max([x.total for x in cards if x is not c] + [0])
    best_tp = total_reqs / (STEP_FIXED_US + STEP_PER_BLOCK_US * c.total)
    best: _Item | None = None
    best_new = False
    for run in c.running:
        top = max(c.total - run.blocks, second)
        tp = (total_reqs - 1) / (STEP_FIXED_US + STEP_PER_BLOCK_US * top)
        if tp > best_tp or (tp == best_tp and run.newly_added and not best_new):
            best, best_tp, best_new = run, tp, run.newly_added
    if best is None:
        return False
    c.running.remove(best)
    c.waiting.append(best)
    c.paused.append(best)
    c.total -= best.blocks
    return True


def _net(c: _Rank) -> tuple[list[_Item], list[_Item]]:
    """The rank's net change: running requests that end paused, waiting ones that end
    admitted (in admission order). A request paused and then taken back in (or pulled in
    and then paused) is not in the plan: it ends where it began."""
    def among(item: _Item, items: list[_Item]) -> bool:
        return any(item is x for x in items)
    pause = [i for i in c.was_running if not among(i, c.running)]
    admit: list[_Item] = []
    for i in c.admitted:
        if among(i, c.running) and not among(i, c.was_running) and not among(i, admit):
            admit.append(i)
    return pause, admit


def _cancel(paused: list[_Item], admitted: list[_Item]) -> tuple[list[_Item], list[_Item]]:
    """Drop (pause, admit) pairs of equal block count, as the real plan does: such a
    pair leaves the rank's load unchanged, so neither request moves."""
    pause = list(paused)
    admit: list[_Item] = []
    for item in admitted:
        twin = next((p for p in pause if p.blocks == item.blocks), None)
        if twin is None:
            admit.append(item)
        else:
            pause.remove(twin)
    return pause, admit
