"""The two-stage BalanceRoute tick (docs/design.md, "BR-0"), shared by BR-0 and BR-H.

The tick works on a private copy of the replica totals and a "taken" set over the
pool's prompt-sorted list; it never mutates the snapshot or the pool. What differs
between BR-0 and BR-H is only the *margin model*: how a replica's F-score for a total
prompt ``D`` is computed and how an admission updates loads. Both models implement
:class:`MarginModel`.

Order of a tick:
1. Ageing: the *starving* requests the policy passes in (:mod:`br_serve.core.ageing`)
   are assigned first. Overdue ones (past a deadline) go before the rest: with an
   ``overdue_band``, those about as overdue as the most overdue one compete by fit
   (the best F over every open replica first); without one, oldest first, each to its
   best-F replica. Then those past the lead time, only where they fit well.
2. While free slots remain and the pool has requests: Stage 1 (``S_tot > S_greedy``,
   one best single request to the replica with most free slots) or Stage 2 (best
   subset of ``R_max`` candidates around the replica's peak; starvation guard).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping
from heapq import heapify, heappop, heappush
from typing import Protocol

from br_serve.core.pool import PromptPool
from br_serve.core.shares import busy_share, load_share
from br_serve.core.types import (
    Assignment,
    ClusterSnapshot,
    PoolRequest,
    TickResult,
)


class Scorer(Protocol):
    """F-score of one replica for ``n_requests`` admitted with prompt total ``D``.

    ``peak`` is where the single-request score is highest (the bisection target).
    """

    peak: float

    def __call__(self, d_tokens: float, n_requests: int = 1) -> float: ...


class MarginModel(Protocol):
    """How BR-0 / BR-H see the replicas during one tick.

    ``rank(g)`` orders replicas with equal free slots (larger first: the larger
    margin). It must depend on ``g``'s own state only, so a replica's rank stays valid
    while others are admitted (the envelope ``M`` is common to all margins).
    """

    def rank(self, g: int) -> float: ...

    def scorer(self, g: int) -> Scorer: ...

    def admit(self, g: int, d_tokens: float, n_requests: int) -> None: ...


class PoolCursor:
    """Bisection over the prompt-sorted pool, skipping requests taken this tick."""

    __slots__ = ("ids", "remaining", "sizes", "taken")

    def __init__(self, pool: PromptPool) -> None:
        self.sizes = pool.sorted_sizes
        self.ids = pool.sorted_ids
        self.taken: set[int] = set()
        self.remaining = len(self.sizes)

    def below(self, x: float, limit: float, k: int) -> list[int]:
        """Up to ``k`` untaken indices with size ``<= min(x, limit)``, largest first."""
        out: list[int] = []
        pos = bisect_right(self.sizes, min(x, limit)) - 1
        while pos >= 0 and len(out) < k:
            if pos not in self.taken:
                out.append(pos)
            pos -= 1
        return out

    def below_head(self, x: float, limit: float, k: int) -> tuple[int | None, bool]:
        """``(head, enough)``: the first index :meth:`below` would return (None: none)
        and whether it would return ``k`` of them, without walking them."""
        pos = bisect_right(self.sizes, min(x, limit)) - 1
        taken = self.taken
        head = pos
        while head >= 0 and head in taken:
            head -= 1
        if head < 0:
            return None, False
        untaken = pos + 1 - sum(1 for t in taken if t <= pos)  # the tick takes a few
        return head, untaken >= k

    def above(self, x: float, limit: float, k: int) -> list[int]:
        """Up to ``k`` untaken indices with ``x < size <= limit``, smallest first."""
        out: list[int] = []
        pos = bisect_right(self.sizes, x)
        n = len(self.sizes)
        while pos < n and len(out) < k and self.sizes[pos] <= limit:
            if pos not in self.taken:
                out.append(pos)
            pos += 1
        return out

    def index_of(self, request_id: str, size: int) -> int:
        lo = bisect_right(self.sizes, size - 1) if size > 0 else 0
        return self.ids.index(request_id, lo)

    def take(self, idx: int) -> None:
        self.taken.add(idx)
        self.remaining -= 1


class _Work:
    """Mutable per-tick copies of free slots and KV room (the tick's scratch state)."""

    __slots__ = ("cap", "kv_room", "s_tot", "size_cap")

    def __init__(self, cluster: ClusterSnapshot) -> None:
        # ClusterSnapshot.free_slots, in lists (numpy's per-call cost dominates at G=16)
        cap: list[int] = (cluster.slots - cluster.running_requests).tolist()
        alive: list[bool] = cluster.alive.tolist()
        if not all(alive):
            cap = [c if a else 0 for c, a in zip(cap, alive, strict=True)]
        self.cap = cap
        self.kv_room: list[int] = (cluster.kv_limit_tokens - cluster.load_tokens).tolist()
        self.s_tot = sum(cap)
        self.size_cap: dict[int, float] = {}  # replica -> largest prompt it may take

    def fits(self, g: int, s: int) -> bool:
        """Whether one request of ``s`` prompt tokens may go to ``g`` (KV room, cap)."""
        return self.kv_room[g] >= s and s <= self.size_cap.get(g, s)

    def limit(self, g: int) -> float:
        """The largest single prompt ``g`` may take now."""
        room = self.kv_room[g]
        cap = self.size_cap.get(g)
        return room if cap is None else min(room, cap)

    def open_replicas(self) -> list[int]:
        return [g for g, c in enumerate(self.cap) if c > 0]

    def use(self, g: int, n: int, d_tokens: int) -> None:
        self.cap[g] -= n
        self.kv_room[g] -= d_tokens
        self.s_tot -= n


def run_two_stage(
    cluster: ClusterSnapshot,
    pool: PromptPool,
    model: MarginModel,
    *,
    s_greedy: int,
    r_max: int,
    starving: Iterable[tuple[PoolRequest, float]] = (),
    soft_fill: float = 0.0,
    overdue_band: float | None = None,
    shallow: bool = False,
    hold_budget_s: float = 0.0,
    hold_min_busy_share: float = 0.0,
    hold_min_load_share: float = 0.0,
    now_s: float = 0.0,
    idle: Iterable[int] = (),
    size_caps: Mapping[int, float] | None = None,
) -> TickResult:
    """One tick of BR-0 / BR-H over ``model``; see the module docstring for the order.

    ``starving``: ``(request, urgency)`` to place first, oldest first (read lazily,
    only while slots are free); ``urgency`` is the largest share of a budget the
    request has used (:meth:`Ageing.starving`). An overdue one (urgency >= 1) goes to
    its best-F replica, or, with ``overdue_band``, competes with the others within
    ``overdue_band`` of the highest urgency among the first ``OVERDUE_SCAN`` overdue
    ones: the (request, replica) pair of highest F goes first, until none is left or
    no slot. A request only past its lead time goes only to a replica where it fills
    well (its prompt between ``soft_fill`` times the replica's peak and the peak; the
    tightest such replica), else it waits. ``idle``: replicas that get nothing this
    tick, starving requests included (their free slots wait).
    """
    work = _Work(cluster)
    for g in idle:  # idled replicas take nothing, starving requests included
        work.use(g, work.cap[g], 0)
    if size_caps:  # capped replicas take no prompt above their cap, starving ones included
        work.size_cap = dict(size_caps)
    cur = PoolCursor(pool)
    out: list[Assignment] = []
    counts = dict.fromkeys(("stage1", "stage2", "guard", "aged", "shallow"), 0)

    def assign(g: int, idxs: list[int], stage: str) -> None:
        d = 0
        for i in idxs:
            cur.take(i)
            s = cur.sizes[i]
            d += s
            out.append(Assignment(cur.ids[i], g, s))
        work.use(g, len(idxs), d)
        model.admit(g, float(d), len(idxs))
        counts[stage] += len(idxs)

    # 1. ageing: starving requests first. Among equally overdue ones, order is free:
    # each has already missed its deadline, and a placement by fit keeps the steps
    # short, which frees the next slots sooner for the rest of them.
    if overdue_band is not None:
        starving = _place_overdue(starving, overdue_band, cur, work, model, assign)
    _place_aged(starving, soft_fill, cur, work, model, assign)

    # 2. a shallow pool (every request left fits the free slots): the question is only
    # where each goes, so place each (largest first) on its best replica.
    if shallow and 0 < cur.remaining <= work.s_tot:
        if hold_budget_s > 0 and (busy_share(cluster) < hold_min_busy_share
                                  or load_share(cluster) < hold_min_load_share):
            hold_budget_s = 0.0
        held, retick = _place_each(pool, cur, work, model, assign, now_s, hold_budget_s)
        return TickResult(tuple(out), counts["stage1"], counts["stage2"], counts["guard"],
                          counts["aged"], shallow=counts["shallow"], held=held,
                          retick_s=retick)

    # 3. the two stages. Replicas in a heap keyed by (free slots, rank), largest first.
    heap = [(-c, -model.rank(g), g) for g, c in enumerate(work.cap) if c > 0]
    heapify(heap)
    while heap and cur.remaining > 0:
        g = heappop(heap)[2]
        sc = model.scorer(g)
        room = work.limit(g)
        if work.s_tot > s_greedy:
            cands = cur.below(sc.peak, room, 1) + cur.above(sc.peak, room, 1)
            if not cands:
                continue  # nothing left fits this replica's KV room: drop it
            assign(g, [_best_single(cands, cur.sizes, sc)], "stage1")
        else:
            if work.cap[g] == 1 or r_max == 1:
                # One slot: the subsets are the singletons, and F is concave with its
                # maximum at the peak, so of the r_max candidates (the largest below
                # the peak, then, if fewer, the smallest above it) only the head of
                # each run can win: the same choice, without walking the runs.
                head, enough = cur.below_head(sc.peak, room, r_max)
                cands = [] if head is None else [head]
                if not enough:
                    cands += cur.above(sc.peak, room, 1)
                if not cands:
                    continue
                best = _best_single(cands, cur.sizes, sc)
                f = sc(float(cur.sizes[best]))
                assign(g, [best], "guard" if f <= 0 else "stage2")
            else:
                cands = cur.below(sc.peak, room, r_max)
                if len(cands) < r_max:
                    cands += cur.above(sc.peak, room, r_max - len(cands))
                if not cands:
                    continue
                chosen, guarded = _best_subset(cands, cur.sizes, sc,
                                               min(work.cap[g], r_max), work.kv_room[g])
                assign(g, chosen, "guard" if guarded else "stage2")
        if work.cap[g] > 0:
            heappush(heap, (-work.cap[g], -model.rank(g), g))

    return TickResult(tuple(out), counts["stage1"], counts["stage2"], counts["guard"],
                      counts["aged"])


OVERDUE_SCAN = 64
"""With an overdue band, the overdue requests one tick reads (oldest first) at most."""


def _place_overdue(starving: Iterable[tuple[PoolRequest, float]], band: float,
                   cur: PoolCursor, work: _Work, model: MarginModel,
                   assign: Callable[[int, list[int], str], None]
                   ) -> list[tuple[PoolRequest, float]]:
    """Place the overdue requests about as overdue as the most overdue one (within
    ``band``) by fit: the pair (request, open replica) of highest F first. Returns the
    starving requests it did not read as overdue (past the lead time only), in order."""
    due: list[tuple[PoolRequest, float]] = []
    rest: list[tuple[PoolRequest, float]] = []
    for req, urgency in starving:
        (due if urgency >= 1.0 else rest).append((req, urgency))
        if len(due) >= OVERDUE_SCAN:
            break
    due.sort(key=lambda x: x[0].prompt_tokens)  # stable: FCFS order within a size
    while due and work.s_tot > 0:
        floor = max(u for _, u in due) - band
        elig = [j for j, (_, u) in enumerate(due) if u >= floor]
        sizes = [due[j][0].prompt_tokens for j in elig]
        best: tuple[float, int, int] | None = None
        for g in work.open_replicas():
            # F is concave with its maximum at the peak: of the requests that fit, only
            # the largest at or below the peak and the smallest above it can win
            sc, lim = model.scorer(g), work.limit(g)
            cands = []
            i = bisect_right(sizes, min(sc.peak, lim)) - 1
            if i >= 0:
                cands.append(bisect_left(sizes, sizes[i]))  # the oldest of that size
            i = bisect_right(sizes, sc.peak)
            if i < len(sizes) and sizes[i] <= lim:
                cands.append(i)
            for i in cands:
                f = sc(float(sizes[i]))
                if best is None or f > best[0]:
                    best = (f, g, elig[i])
        if best is None:  # those fit nowhere now (nor later this tick): they wait
            due = [(r, u) for r, u in due if u < floor]
            continue
        _, g, j = best
        req = due.pop(j)[0]
        assign(g, [cur.index_of(req.request_id, req.prompt_tokens)], "aged")
    return rest


def _place_aged(starving: Iterable[tuple[PoolRequest, float]], soft_fill: float,
                cur: PoolCursor, work: _Work, model: MarginModel,
                assign: Callable[[int, list[int], str], None]) -> None:
    """Oldest first, an overdue request to its best-F replica, one past its lead time
    only where it fills well (``soft_fill``)."""
    for req, urgency in starving:
        if work.s_tot <= 0:
            break
        s = req.prompt_tokens
        cands = [g for g in work.open_replicas() if work.fits(g, s)]
        if urgency < 1.0:
            cands = [g for g in cands if soft_fill * model.scorer(g).peak <= s
                     <= model.scorer(g).peak]
        if not cands:
            continue
        best_g = max(cands, key=lambda r: (model.scorer(r)(float(s)), -model.scorer(r).peak))
        assign(best_g, [cur.index_of(req.request_id, s)], "aged")


def _place_each(pool: PromptPool, cur: PoolCursor, work: _Work, model: MarginModel,
                assign: Callable[[int, list[int], str], None], now_s: float,
                hold_budget_s: float) -> tuple[int, float | None]:
    """Shallow pool: each untaken request, largest first, to the open replica with the
    highest F (ties: the larger rank, i.e. the least projected load).

    A request that would overflow every open replica (its prompt above each one's peak)
    is held while it has been in the pool less than ``hold_budget_s``. Returns how many
    were held and when the earliest hold expires (None: none held).
    """
    held, retick = 0, None
    for i in range(len(cur.sizes) - 1, -1, -1):
        if i in cur.taken:
            continue
        if work.s_tot <= 0:
            break
        s = cur.sizes[i]
        cands = [g for g in work.open_replicas() if work.fits(g, s)]
        if not cands:
            continue
        scores = [(model.scorer(g)(float(s)), model.rank(g), -g) for g in cands]
        if hold_budget_s > 0:
            req = pool.get(cur.ids[i])
            until = req.enqueued_s + hold_budget_s
            if now_s < until and all(s > model.scorer(g).peak for g in cands):
                held += 1
                retick = until if retick is None else min(retick, until)
                continue
        best = max(range(len(cands)), key=scores.__getitem__)
        assign(cands[best], [i], "shallow")
    return held, retick


def _best_single(cands: list[int], sizes: list[int], sc: Scorer) -> int:
    """The candidate with the highest single-request F, first among equals.

    ``cands`` lists the candidates below the peak largest first, then those above it
    smallest first; F (concave, peaking at ``sc.peak``) is non-decreasing along the
    first run and non-increasing along the second, so only the head of each run can
    win, and the head of the first wins ties as ``max`` over the whole list would.
    """
    first = cands[0]
    peak = sc.peak
    if sizes[first] > peak:  # no candidate below the peak
        return first
    for i in cands:
        if sizes[i] > peak:  # the head of the run above the peak
            return i if sc(float(sizes[i])) > sc(float(sizes[first])) else first
    return first


def _best_subset(cands: list[int], sizes: list[int], sc: Scorer, max_n: int,
                 room: int) -> tuple[list[int], bool]:
    """Subset of ``cands`` maximising F under size and KV limits; guard if F <= 0.

    Returns the chosen pool indices and whether the starvation guard picked them.
    Enumerates the ``2^r - 1`` subsets by doubling (entry ``k`` of the sums is the
    subset whose bit ``j`` says "candidate ``j`` is in"), in plain Python: for
    ``r <= 4`` this is several times faster than numpy's per-call overhead.
    Singletons always fit (callers only pass candidates that fit ``room``).
    """
    if max_n == 1:
        best = max(cands, key=lambda i: sc(float(sizes[i])))
        return [best], sc(float(sizes[best])) <= 0
    sums = [0]
    counts = [0]
    for i in cands:
        s = sizes[i]
        sums += [x + s for x in sums]
        counts += [k + 1 for k in counts]
    best_k, best_f = 0, -float("inf")
    for k in range(1, len(sums)):
        d = sums[k]
        if counts[k] <= max_n and d <= room:
            f = sc(float(d), counts[k])
            if f > best_f:
                best_k, best_f = k, f
    if best_f > 0:
        return [c for j, c in enumerate(cands) if best_k >> j & 1], False
    single = max(range(len(cands)), key=lambda j: sc(float(sizes[cands[j]])))
    return [cands[single]], True

