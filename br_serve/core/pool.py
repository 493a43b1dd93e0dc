"""The prompt pool: prefilled requests waiting for a decode slot (late binding).

Two orders are kept at once: arrival order (FCFS, for baselines and ``max_wait``
ageing) and prompt-length order (for the bisection of the BR stages). The pool is the
only mutable object here; policies read it and return assignments, and the owner (the
simulator or the scheduler actor) removes what was assigned with :meth:`remove_many`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from br_serve.core.types import Assignment, PoolRequest


class PoolFullError(RuntimeError):
    """The pool holds ``capacity`` requests already (backpressure: retry later)."""


@dataclass(frozen=True, slots=True)
class PoolTicket:
    """Where a removed request stood in the pool, so :meth:`PromptPool.restore` can put
    it back as if it had never left (its FCFS position and its overtake count)."""

    seq: int
    removed_at_entry: int
    size_at_entry: int
    tokens_through_entry: int


class PromptPool:
    """Bounded pool of :class:`PoolRequest`, indexed by id, arrival and prompt length.

    Invariants: ``sorted_sizes`` is ascending and ``sorted_ids[i]`` is the request whose
    prompt has ``sorted_sizes[i]`` tokens; among equal sizes, earlier arrivals come
    first; every id appears once.

    Raises:
        ValueError: ``capacity < 1``, a duplicate id, or a negative prompt length.
        PoolFullError: adding to a full pool.
    """

    __slots__ = ("_by_id", "_capacity", "_entered_tokens", "_entry", "_entry_tokens", "_ids",
                 "_next_seq", "_removed", "_removed_tokens", "_seq", "_sizes")

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError("capacity: must be >= 1")
        self._capacity = capacity
        self._by_id: dict[str, PoolRequest] = {}
        self._sizes: list[int] = []
        self._ids: list[str] = []
        # For overtake counting: removals so far, and per request (removals, pool size)
        # at the moment it entered.
        self._removed = 0
        self._entry: dict[str, tuple[int, int]] = {}
        # insertion order numbers: FCFS position of a request put back by restore()
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        # The prompt-token clock (ageing): prompt tokens that have entered / left so
        # far, and per request the tokens that had entered up to and including it
        # (FCFS would have released that many by its turn).
        self._entered_tokens = 0
        self._removed_tokens = 0
        self._entry_tokens: dict[str, int] = {}

    # -- reading -----------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def sorted_sizes(self) -> list[int]:
        """Prompt lengths, ascending. Callers must not mutate the list."""
        return self._sizes

    @property
    def sorted_ids(self) -> list[str]:
        """Request ids parallel to :attr:`sorted_sizes`. Callers must not mutate."""
        return self._ids

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> PoolRequest:
        return self._by_id[request_id]

    @property
    def released_tokens(self) -> int:
        """Prompt tokens of the requests that have left the pool so far (assigned or
        cancelled; a restored request's are taken back)."""
        return self._removed_tokens

    def tokens_through(self, request_id: str) -> int:
        """Prompt tokens that entered the pool up to and including this request: FCFS
        would have released that many by the time it released this one. Raises
        KeyError if absent."""
        return self._entry_tokens[request_id]

    def fcfs(self) -> Iterator[PoolRequest]:
        """Requests in arrival (insertion) order."""
        return iter(self._by_id.values())

    def fcfs_overtaken(self) -> Iterator[tuple[PoolRequest, int]]:
        """Requests in arrival order with how many *newer* requests left the pool first.

        For the request at FCFS position ``rank``: removals since it entered, minus the
        older requests that have left since (``size_at_entry - rank``). The count never
        increases along the FCFS order, so a scan from the head can stop at the first
        request below a threshold. Cancelled newer requests count as overtakes too.
        """
        removed = self._removed
        for rank, (rid, req) in enumerate(self._by_id.items()):
            at_removed, at_size = self._entry[rid]
            yield req, (removed - at_removed) - (at_size - rank)

    def fcfs_ranks(self) -> Iterator[tuple[PoolRequest, int, int]]:
        """Requests in arrival order with their entry rank and overtake count.

        The entry rank is how many requests entered the pool before this one (FCFS
        would release it as release number ``rank + 1``); the overtake count is as in
        :meth:`fcfs_overtaken`. Ranks increase along the order.
        """
        removed = self._removed
        for rank, (rid, req) in enumerate(self._by_id.items()):
            at_removed, at_size = self._entry[rid]
            yield req, at_removed + at_size, (removed - at_removed) - (at_size - rank)

    def head_rank(self) -> int | None:
        """Entry rank of the oldest request (None: empty pool)."""
        for rid in self._by_id:
            at_removed, at_size = self._entry[rid]
            return at_removed + at_size
        return None

    @property
    def released(self) -> int:
        """Requests that have left the pool so far (assigned or cancelled)."""
        return self._removed

    def is_full(self) -> bool:
        return len(self._by_id) >= self._capacity

    # -- writing -----------------------------------------------------------------
    def add(self, req: PoolRequest) -> None:
        if req.request_id in self._by_id:
            raise ValueError(f"request_id: {req.request_id!r} is already in the pool")
        if req.prompt_tokens < 0:
            raise ValueError("prompt_tokens: must be >= 0")
        if len(self._by_id) >= self._capacity:
            raise PoolFullError(f"prompt pool full ({self._capacity} requests)")
        self._entry[req.request_id] = (self._removed, len(self._by_id))
        self._entered_tokens += req.prompt_tokens
        self._entry_tokens[req.request_id] = self._entered_tokens
        self._seq[req.request_id] = self._next_seq
        self._next_seq += 1
        self._by_id[req.request_id] = req
        self._insert_sorted(req)

    def _insert_sorted(self, req: PoolRequest) -> None:
        pos = bisect_right(self._sizes, req.prompt_tokens)
        self._sizes.insert(pos, req.prompt_tokens)
        self._ids.insert(pos, req.request_id)

    def ticket(self, request_id: str) -> PoolTicket:
        """The ticket :meth:`restore` needs to put ``request_id`` back after a removal.
        Raises KeyError if absent."""
        at_removed, at_size = self._entry[request_id]
        return PoolTicket(self._seq[request_id], at_removed, at_size,
                          self._entry_tokens[request_id])

    def restore(self, req: PoolRequest, ticket: PoolTicket) -> None:
        """Undo the removal of ``req`` (taken with ``ticket`` just before it was removed):
        it goes back to its FCFS position, and overtake counts of every request are as if
        it had never left (newer requests removed meanwhile count as overtaking it).

        Capacity is not checked: the request had its place already (a refused dispatch
        must not lose it, nor jump the queue). Callers restore each removal at most once.

        Raises:
            ValueError: ``req`` is in the pool already.
        """
        rid = req.request_id
        if rid in self._by_id:
            raise ValueError(f"request_id: {rid!r} is already in the pool")
        self._removed -= 1  # its removal never happened, as far as overtakes go
        self._removed_tokens -= req.prompt_tokens
        self._entry[rid] = (ticket.removed_at_entry, ticket.size_at_entry)
        self._entry_tokens[rid] = ticket.tokens_through_entry
        self._seq[rid] = ticket.seq
        items = list(self._by_id.items())
        at = next((k for k, (other, _) in enumerate(items)
                   if self._seq[other] > ticket.seq), len(items))
        items.insert(at, (rid, req))
        self._by_id = dict(items)
        self._insert_sorted(req)

    def remove(self, request_id: str) -> PoolRequest:
        """Remove one request and return it. Raises KeyError if absent."""
        req = self._by_id.pop(request_id)
        del self._entry[request_id]
        del self._entry_tokens[request_id]
        del self._seq[request_id]
        self._removed += 1
        self._removed_tokens += req.prompt_tokens
        lo = bisect_left(self._sizes, req.prompt_tokens)
        hi = bisect_right(self._sizes, req.prompt_tokens, lo)
        pos = self._ids.index(request_id, lo, hi)
        del self._sizes[pos]
        del self._ids[pos]
        return req

    def remove_many(self, assignments: Iterable[Assignment]) -> list[PoolRequest]:
        """Remove every assigned request; returns them in assignment order."""
        return [self.remove(a.request_id) for a in assignments]
