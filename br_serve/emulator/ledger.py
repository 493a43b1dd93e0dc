"""The prefill side's KV ledger: every hold issued is released exactly once.

A pure object with an injected clock. The prefill role issues a hold when its prefill
finishes (vLLM: the ``kv_transfer_params`` it returns; SGLang: the ``bootstrap_room``
it serves); the hold ends in exactly one of three ways, each counted:

- ``pulled``: the decode twin presented matching parameters and took the KV;
- ``aborted``: the request was cancelled (abort endpoint, client disconnect);
- ``expired``: nobody pulled it within ``ttl_s`` (vLLM's
  ``VLLM_*_ABORT_REQUEST_TIMEOUT``, SGLang's bootstrap timeout).

A pull of a key that was never issued, was already released, or whose recorded fields
differ from the presented ones is refused with :class:`KVRefused` and releases nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ReleaseReason = Literal["pulled", "aborted", "expired"]


class KVRefused(Exception):
    """A pull the ledger cannot honour; ``reason``: ``unknown``, ``released``, ``mismatch``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Hold:
    """One issued hold: the fields a pull must match, and bookkeeping."""

    key: str
    fields: Mapping[str, Any]
    prompt_tokens: int
    rank: int
    issued_at_s: float


@dataclass(slots=True)
class LedgerStats:
    issued: int = 0
    released: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)


class KVLedger:
    """Holds by key; ``history`` maps every released key to its reason (for tests)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float],
                 history_limit: int = 100_000) -> None:
        if ttl_s <= 0:
            raise ValueError(f"kv_ttl_s: must be > 0 (got {ttl_s})")
        self.ttl_s = ttl_s
        self._clock = clock
        self._held: dict[str, Hold] = {}
        self.history: dict[str, ReleaseReason] = {}
        self._history_limit = history_limit
        self.stats = LedgerStats()

    def issue(self, key: str, fields: Mapping[str, Any], prompt_tokens: int,
              rank: int = 0) -> Hold:
        if key in self._held or key in self.history:
            raise ValueError(f"{key!r} was already issued")
        hold = Hold(key, dict(fields), prompt_tokens, rank, self._clock())
        self._held[key] = hold
        self.stats.issued += 1
        return hold

    def pull(self, key: str, presented: Mapping[str, Any],
             count_unknown: bool = True) -> Hold:
        """Release ``key`` as pulled if ``presented`` matches every recorded field.
        ``count_unknown=False``: a key never issued is not counted as refused (the
        caller waits for it and counts it with :meth:`refuse` only if it never comes)."""
        hold = self._held.get(key)
        if hold is None:
            reason = "released" if key in self.history else "unknown"
            if reason != "unknown" or count_unknown:
                self.stats.refused[reason] += 1
            what = (f"was already released ({self.history[key]})" if reason == "released"
                    else "was never issued by this prefill server")
            raise KVRefused(reason, f"KV {key!r} {what}")
        for name, want in hold.fields.items():
            got = presented.get(name)
            if got != want:
                self.stats.refused["mismatch"] += 1
                raise KVRefused("mismatch", f"KV {key!r}: {name} is {got!r}, the prefill "
                                            f"server issued {want!r}")
        self._release(key, "pulled")
        return hold

    def refuse(self, reason: str) -> None:
        """Count a refusal decided outside :meth:`pull` (a wait that timed out)."""
        self.stats.refused[reason] += 1

    def abort(self, key: str) -> bool:
        if key not in self._held:
            return False
        self._release(key, "aborted")
        return True

    def expire(self) -> list[str]:
        """Release every hold older than ``ttl_s``; returns their keys."""
        now = self._clock()
        old = [k for k, h in self._held.items() if now - h.issued_at_s >= self.ttl_s]
        for k in old:
            self._release(k, "expired")
        return old

    def holds(self, key: str) -> bool:
        return key in self._held

    def released_reason(self, key: str) -> ReleaseReason | None:
        return self.history.get(key)

    def held_tokens(self, rank: int) -> int:
        """Prompt tokens of the KV held for ``rank``."""
        return sum(h.prompt_tokens for h in self._held.values() if h.rank == rank)

    @property
    def held(self) -> int:
        return len(self._held)

    def _release(self, key: str, reason: ReleaseReason) -> None:
        del self._held[key]
        self.stats.released[reason] += 1
        if len(self.history) >= self._history_limit:
            self.history.pop(next(iter(self.history)))
        self.history[key] = reason

    def snapshot(self) -> dict[str, Any]:
        return {"issued": self.stats.issued, "held": self.held,
                "released": {r: self.stats.released.get(r, 0)
                             for r in ("pulled", "aborted", "expired")},
                "refused": dict(self.stats.refused),
                "release_reason_by_id": dict(self.history)}
