"""What a decode replica has taken, and what its next report must say (pure, no Ray).

The decode replica actor (:mod:`br_serve.serve.decode`) keeps one :class:`ReplicaBook`
under its lock; its RPC handlers and its step thread both go through it. The book's
promise, which the scheduler's mirror relies on to free every slot it counted: every
request the replica *took* (``accept`` answered ``queued``) ends in exactly one of

- ``finished``: its last token was produced (reported in ``finished_ids``);
- ``dropped``: it ended without finishing: aborted by its owner, or refused by the
  engine at install time (reported in ``dropped_ids``);
- ``failed``: its KV pull failed (``admit`` answers ``failed``; never installed).

Life of one request id::

    accept -> PULLING --pulled--> QUEUED --take_work--> INSTALLED --last token--> finished
                 |                   |                      |
           pull_failed: failed    abort: dropped     abort: dropped at the next take_work
           (abort while PULLING: dropped when the pull ends)

Slots count every taken request (pulling, queued, installed), so concurrent admissions
can never over-fill the replica.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from br_serve.engine.base import TokenEvent
from br_serve.serve.messages import Admission, AdmitStatus, StreamEvent

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
        return installs, aborts

    def install_failed(self, request_id: str) -> str | None:
        """The engine refused an install: dropped. Returns its owner."""
        owner = self._owner.get(request_id)
        self._end(request_id, dropped=True)
        return owner

    def route(self, events: Iterable[TokenEvent]) -> dict[str, list[StreamEvent]]:
        """Group one step's events by owner; a finished request leaves the book."""
        out: dict[str, list[StreamEvent]] = {}
        for e in events:
            owner = self._owner.get(e.request_id)
            if e.finished and e.request_id in self._state:
                self._finished.append((e.request_id, e.index + 1))
                self._end(e.request_id, dropped=False)
            if owner is not None:
                out.setdefault(owner, []).append(e)
        return out

    def take_report(self) -> tuple[list[tuple[str, int]], list[str]]:
        """Finished ``(id, output tokens)`` and dropped ids since the last report."""
        fin, drop = self._finished, self._dropped
        self._finished, self._dropped = [], []
        return fin, drop

    def put_back(self, finished: list[tuple[str, int]], dropped: list[str]) -> None:
        """A report could not be sent: its lists go into the next one."""
        self._finished[:0] = finished
        self._dropped[:0] = dropped

    def _end(self, request_id: str, dropped: bool) -> None:
        if self._state.pop(request_id, None) is not None and dropped:
            self._dropped.append(request_id)
        self._owner.pop(request_id, None)
