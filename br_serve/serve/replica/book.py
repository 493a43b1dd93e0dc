"""What a decode replica has taken, and what its next report must say (pure, no Ray).

The decode replica actor (:mod:`br_serve.serve.replica.decode`) keeps one :class:`ReplicaBook`
under its lock; its RPC handlers and its step thread both go through it. The book's
promise, which the scheduler's mirror relies on to free every slot it counted: every
request the replica *took* (``accept`` answered ``queued``) ends in exactly one of

- ``finished``: its last token was produced (reported in ``finished_ids``);
- ``dropped``: it ended without finishing: aborted by its owner, refused by the
  engine at install time, or failed in a remote engine (reported in ``dropped_ids``);
- ``failed``: its KV pull failed (``admit`` answers ``failed``; never installed).

Life of one request id::

    accept -> PULLING --pulled--> QUEUED --take_work--> INSTALLED --last token--> finished
                 |                   |                      |
           pull_failed: failed    abort: dropped     abort: dropped at the next take_work
           (abort while PULLING: dropped when the pull ends)

Slots count every taken request (pulling, queued, installed), so concurrent admissions
can never over-fill the replica.

:class:`ReportClock` decides after each step whether the replica reports to the
scheduler and whether in full (every running row) or as a delta (installed, finished,
dropped since the previous report): reports cost an RPC each, so a member with nothing
new says nothing, except its periodic full state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from br_serve.engine.base import DecodeEngine, TokenEvent
from br_serve.serve.wire.messages import (
    Admission,
    AdmitStatus,
    ReplicaReport,
    WireEvent,
    wire_token,
)

_PULLING, _QUEUED, _INSTALLED = "pulling", "queued", "installed"


class ReplicaBook:
    """See the module docstring. Not thread-safe: the owner serialises calls."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots: must be >= 1")
        self.slots = slots
        self._state: dict[str, str] = {}
        self._owner: dict[str, str] = {}
        self._queue: dict[str, tuple[Admission, Any]] = {}
        self._abort_pulling: set[str] = set()
        self._abort_installed: list[str] = []
        self._finished: list[tuple[str, int]] = []
        self._dropped: list[str] = []
        self._started: list[str] = []

    # -- queries ------------------------------------------------------------------
    def taken(self) -> int:
        """Requests holding a slot (pulling, queued or installed)."""
        return len(self._state)

    def owner_of(self, request_id: str) -> str | None:
        return self._owner.get(request_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._state

    def installed_ids(self) -> list[str]:
        return [r for r, s in self._state.items() if s == _INSTALLED]

    def has_work(self) -> bool:
        """Anything for the step thread: requests to install or abort, or installed."""
        return bool(self._queue or self._abort_installed
                    or any(s == _INSTALLED for s in self._state.values()))

    # -- the RPC side -------------------------------------------------------------
    def accept(self, request_id: str, owner: str) -> AdmitStatus:
        """Reserve a slot for ``request_id`` before its KV is pulled."""
        if request_id in self._state:
            return "duplicate"
        if len(self._state) >= self.slots:
            return "full"
        self._state[request_id] = _PULLING
        self._owner[request_id] = owner
        return "queued"

    def pulled(self, item: Admission, kv: Any) -> bool:
        """The KV of a taken request is here: queue it for the step thread. False (and
        the request dropped) if its owner aborted it during the pull."""
        rid = item.request_id
        if rid in self._abort_pulling:
            self._abort_pulling.discard(rid)
            self._end(rid, dropped=True)
            return False
        self._state[rid] = _QUEUED
        self._queue[rid] = (item, kv)
        return True

    def pull_failed(self, request_id: str) -> str | None:
        """The pull failed: the request will never run here. Returns its owner."""
        self._abort_pulling.discard(request_id)
        owner = self._owner.get(request_id)
        self._end(request_id, dropped=False)
        return owner

    def abort(self, request_id: str) -> None:
        """The owner gave the request up (no-op for an id this replica does not hold)."""
        state = self._state.get(request_id)
        if state == _PULLING:
            self._abort_pulling.add(request_id)
        elif state == _QUEUED:
            del self._queue[request_id]
            self._end(request_id, dropped=True)
        elif state == _INSTALLED and request_id not in self._abort_installed:
            self._abort_installed.append(request_id)

    # -- the step thread ----------------------------------------------------------
    def take_work(self) -> tuple[list[tuple[Admission, Any]], list[str]]:
        """At the start of a step: the requests to install and the ids to abort in the
        engine (both now counted: installs as installed, aborts as dropped)."""
        aborts = [r for r in self._abort_installed if self._state.get(r) == _INSTALLED]
        self._abort_installed.clear()
        for rid in aborts:
            self._end(rid, dropped=True)
        installs = list(self._queue.values())
        self._queue.clear()
        for item, _ in installs:
            self._state[item.request_id] = _INSTALLED
            self._started.append(item.request_id)
        return installs, aborts

    def install_failed(self, request_id: str) -> str | None:
        """The engine refused an install, or (a remote engine) an installed request's
        stream failed: dropped. Returns its owner."""
        owner = self._owner.get(request_id)
        self._end(request_id, dropped=True)
        if request_id in self._started:
            self._started.remove(request_id)
        return owner

    def route(self, events: Iterable[TokenEvent]) -> dict[str, list[WireEvent]]:
        """Group one step's events by owner (as :data:`WireToken` tuples); a finished
        request leaves the book."""
        out: dict[str, list[WireEvent]] = {}
        for e in events:
            owner = self._owner.get(e.request_id)
            if e.finished and e.request_id in self._state:
                self._finished.append((e.request_id, e.index + 1))
                self._end(e.request_id, dropped=False)
            if owner is not None:
                out.setdefault(owner, []).append(wire_token(e))
        return out

    def take_report(self) -> tuple[list[tuple[str, int]], list[str], list[str]]:
        """Finished ``(id, output tokens)``, dropped ids and installed ids since the
        last report."""
        fin, drop, started = self._finished, self._dropped, self._started
        self._finished, self._dropped, self._started = [], [], []
        return fin, drop, started

    def put_back(self, finished: list[tuple[str, int]], dropped: list[str]) -> None:
        """A report could not be sent: its lists go into the next one (which must be a
        full report, for the installs it missed)."""
        self._finished[:0] = finished
        self._dropped[:0] = dropped

    def _end(self, request_id: str, dropped: bool) -> None:
        if self._state.pop(request_id, None) is not None and dropped:
            self._dropped.append(request_id)
        self._owner.pop(request_id, None)


#: every member sends its full state at least this often (steps), staggered by index
FULL_EVERY = 64
#: an idle replica still reports this often (seconds), so a restarted scheduler hears
KEEPALIVE_S = 1.0


class ReportClock:
    """When replica ``index`` reports after a step, and whether in full (pure).

    A report is sent when the replica has news (installed, finished or dropped
    requests), when its periodic full state is due (every ``full_every`` barrier
    steps, staggered by index, and at the first step of every generation), or as a
    keep-alive after ``keepalive_s`` of silence; :meth:`decide` says so before the
    step's exchange (the flag every member contributes to it). The group's rank 0 also
    reports every step in which any member had work (its report carries the barrier
    rows of all). A report that could not be sent makes the next one full.
    """

    def __init__(self, index: int, full_every: int = FULL_EVERY,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self.index = index
        self.full_every = full_every
        self.keepalive_s = keepalive_s
        self._force_full = True
        self._last_sent = -math.inf

    def decide(self, *, news: bool, barrier_step: int, now_s: float) -> tuple[bool, bool]:
        """``(send, full)`` for the step about to be exchanged as ``barrier_step``."""
        full = (self._force_full or barrier_step <= 1
                or (barrier_step + self.index) % self.full_every == 0
                or now_s - self._last_sent > self.keepalive_s)
        return news or full, full

    def sent(self, ok: bool, now_s: float) -> None:
        if ok:
            self._last_sent = now_s
            self._force_full = False
        else:
            self._force_full = True


def build_report(index: int, incarnation: str, engine: DecodeEngine, step: int,
                 barrier: Any, rows: Any, finished: list[tuple[str, int]],
                 dropped: list[str], started: list[str], *, full: bool = True,
                 compute_s: float = 0.0, barrier_s: float = 0.0,
                 with_compute: bool = False) -> ReplicaReport:
    """The replica's report after ``step`` (``rows``: the exchanged barrier matrix when
    this replica is the group's rank 0, else None). ``full``: every running row, else
    only the ``started`` ones still running. ``with_compute``: rank 0's report carries
    every member's measured compute time (the rows' fourth column)."""
    ids = tuple(engine.running_ids()) if full else tuple(
        r for r in started if r in set(engine.running_ids()))
    return ReplicaReport(
        replica=index, generation=barrier.generation, step=step,
        load_tokens=int(engine.load_tokens()), running_ids=ids,
        prompt_tokens=tuple(int(engine.prompt_tokens_of(r)) for r in ids),
        decoded_tokens=tuple(int(engine.decoded_steps(r)) for r in ids),
        finished_ids=tuple(f[0] for f in finished),
        finished_output_tokens=tuple(f[1] for f in finished),
        members=barrier.members,
        barrier_loads=() if rows is None else tuple(int(x) for x in rows[:, 0]),
        barrier_running=() if rows is None else tuple(int(x) for x in rows[:, 1]),
        barrier_flags=() if rows is None else tuple(int(x) for x in rows[:, 2]),
        barrier_compute_s=(tuple(float(x) for x in rows[:, 3])
                           if rows is not None and with_compute else ()),
        compute_s=compute_s, barrier_s=barrier_s, dropped_ids=tuple(dropped),
        incarnation=incarnation, barrier_step=barrier.steps, full=full)


def as_delta(full: ReplicaReport, started: list[str]) -> ReplicaReport:
    """The delta form of a full report: only the ``started`` rows."""
    keep = set(started)
    rows = [(r, p, d) for r, p, d in zip(full.running_ids, full.prompt_tokens,
                                         full.decoded_tokens, strict=True) if r in keep]
    return dataclasses.replace(full, full=False, running_ids=tuple(r[0] for r in rows),
                               prompt_tokens=tuple(r[1] for r in rows),
                               decoded_tokens=tuple(r[2] for r in rows))
