"""Lock-step decode core of the engine emulator: G data-parallel ranks, one step for all.

A pure object (no asyncio, no HTTP, no clock): the server's step loop calls
:meth:`LockstepCore.plan` (decide), sleeps the planned duration, then calls
:meth:`LockstepCore.apply` (apply), exactly as a DP-attention engine runs one forward
pass for all its ranks at once.

Contracts:
- A request is admitted to one rank with its prompt length, ``max_tokens`` and seed.
  A rank runs at most ``slots`` requests; further ones wait (FIFO per rank) and start
  at the next step boundary that finds a free slot.
- ``plan()`` starts waiting requests into free slots, then reports per rank the running
  ids and the load (sum over running requests of prompt tokens + tokens emitted so
  far). The step lasts ``max over all ranks g of (a_g * load_g + b_g)``: an idle rank
  still costs ``b_g`` (it runs a dummy batch), the slowest rank sets the step. A plan
  with nothing running anywhere has ``duration_s == 0`` and ``empty`` is true.
- ``apply(plan)`` makes every request of the plan that is still running (not aborted,
  not on a stalled rank) emit exactly one token; a request that reaches ``max_tokens``
  finishes and frees its slot. Requests admitted after ``plan()`` join the next plan.
- Tokens are a pure function of ``(seed, prompt_tokens + index)`` (the same function as
  the built-in emulated engine), so the first decoded token equals the token a prefill
  of the same prompt and seed returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from br_serve.engine.emulated import token_id, token_text


@dataclass(frozen=True, slots=True)
class StepModel:
    """Per-rank step-time coefficients: ``a_s_per_token[g]`` and ``b_s[g]`` (seconds)."""

    a_s_per_token: tuple[float, ...]
    b_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.a_s_per_token) != len(self.b_s) or not self.b_s:
            raise ValueError("step model: a and b need one value per rank "
                             f"(got {len(self.a_s_per_token)} and {len(self.b_s)})")
        if min(self.a_s_per_token) < 0 or min(self.b_s) < 0:
            raise ValueError("step model: coefficients must be >= 0")

    @classmethod
    def uniform(cls, dp_size: int, a_s_per_token: float, b_s: float) -> StepModel:
        return cls((a_s_per_token,) * dp_size, (b_s,) * dp_size)

    def step_s(self, loads: Sequence[int]) -> float:
        return max(a * n + b for a, b, n in zip(self.a_s_per_token, self.b_s, loads,
                                                strict=True))


class TokenEvent(NamedTuple):
    """One emitted token. ``position`` counts output tokens from 0; ``finished`` on the last one.

    A NamedTuple, not a frozen dataclass: one is built per token per step, and a
    frozen dataclass costs ~8x more to construct (benchmarks/emulator_cost.py).
    """

    request_id: str
    rank: int
    position: int
    token_id: int
    text: str
    finished: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step runs: ``running[g]`` ids per rank, ``loads[g]`` tokens, duration."""

    step: int
    running: tuple[tuple[str, ...], ...]
    loads: tuple[int, ...]
    duration_s: float

    @property
    def empty(self) -> bool:
        return not any(self.running)


class _Req:
    __slots__ = ("emitted", "max_tokens", "prompt_tokens", "rank", "rid", "seed")

    def __init__(self, rid: str, rank: int, prompt_tokens: int, max_tokens: int,
                 seed: int) -> None:
        self.rid = rid
        self.rank = rank
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.seed = seed
        self.emitted = 0


@dataclass(slots=True)
class RankCounters:
    """Per-rank counters (mutable, owned by the core; copied out by ``snapshot``)."""

    admitted: list[str]
    tokens: int = 0
    finished: int = 0
    aborted: int = 0
    max_running: int = 0


class LockstepCore:
    """G ranks decoding in lock-step; not thread-safe (one event loop owns it).

    Raises:
        ValueError: a duplicate request id, a rank out of range, ``prompt_tokens < 1``
            or ``max_tokens < 1``.
    """

    def __init__(self, step_model: StepModel, slots: int, vocab_size: int = 32000) -> None:
        if slots < 1:
            raise ValueError(f"slots: must be >= 1 (got {slots})")
        self.model = step_model
        self.dp_size = len(step_model.b_s)
        self.slots = slots
        self.vocab_size = vocab_size
        self.steps = 0
        self._reqs: dict[str, _Req] = {}
        self._running: list[dict[str, _Req]] = [{} for _ in range(self.dp_size)]
        self._waiting: list[deque[_Req]] = [deque() for _ in range(self.dp_size)]
        self._load = [0] * self.dp_size
        self._stalled: set[int] = set()
        self.counters = [RankCounters(admitted=[]) for _ in range(self.dp_size)]

    # -- admission -----------------------------------------------------------------
    def admit(self, request_id: str, rank: int, prompt_tokens: int, max_tokens: int,
              seed: int) -> None:
        if request_id in self._reqs:
            raise ValueError(f"request_id: {request_id!r} is already running")
        if not 0 <= rank < self.dp_size:
            raise ValueError(f"rank: {rank} out of range [0, {self.dp_size})")
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1 "
                             f"(got {prompt_tokens}, {max_tokens})")
        req = _Req(request_id, rank, prompt_tokens, max_tokens, seed)
        self._reqs[request_id] = req
        self._waiting[rank].append(req)
        self.counters[rank].admitted.append(request_id)

    def abort(self, request_id: str) -> bool:
        """Remove a waiting or running request; ``False`` when it is not here."""
        req = self._reqs.pop(request_id, None)
        if req is None:
            return False
        running = self._running[req.rank]
        if running.pop(request_id, None) is not None:
            self._load[req.rank] -= req.prompt_tokens + req.emitted
        else:
            self._waiting[req.rank].remove(req)
        self.counters[req.rank].aborted += 1
        return True

    def drop_rank(self, rank: int) -> list[str]:
        """Abort every request of ``rank`` (a rank that died); returns their ids."""
        ids = [*self._running[rank], *(r.rid for r in self._waiting[rank])]
        for rid in ids:
            self.abort(rid)
        return ids

    def set_stalled(self, rank: int, stalled: bool) -> None:
        """A stalled rank keeps its requests but emits no tokens (a hung rank)."""
        (self._stalled.add if stalled else self._stalled.discard)(rank)

    # -- decide / apply ------------------------------------------------------------
    def plan(self) -> StepPlan:
        for g in range(self.dp_size):
            running, waiting = self._running[g], self._waiting[g]
            while waiting and len(running) < self.slots:
                req = waiting.popleft()
                running[req.rid] = req
                self._load[g] += req.prompt_tokens + req.emitted
            c = self.counters[g]
            c.max_running = max(c.max_running, len(running))
        running_ids = tuple(tuple(r) if g not in self._stalled else ()
                            for g, r in enumerate(self._running))
        loads = tuple(self._load)
        if not any(running_ids):
            return StepPlan(self.steps, running_ids, loads, 0.0)
        return StepPlan(self.steps, running_ids, loads, self.model.step_s(loads))

    def apply(self, plan: StepPlan) -> list[TokenEvent]:
        if plan.empty:
            return []
        self.steps += 1
        events: list[TokenEvent] = []
        emit, tok, text, vocab = events.append, token_id, token_text, self.vocab_size
        for g, ids in enumerate(plan.running):
            if not ids:
                continue
            running = self._running[g]
            done: list[_Req] = []
            n = 0
            for rid in ids:
                req = running.get(rid)
                if req is None:
                    continue  # aborted between plan and apply
                idx = req.emitted
                tid = tok(req.seed, req.prompt_tokens + idx, vocab)
                req.emitted = idx + 1
                fin = idx + 1 >= req.max_tokens
                emit(TokenEvent(rid, g, idx, tid, text(tid), fin))
                n += 1
                if fin:
                    done.append(req)
            c = self.counters[g]
            c.tokens += n
            self._load[g] += n
            for req in done:
                del running[req.rid]
                del self._reqs[req.rid]
                self._load[g] -= req.prompt_tokens + req.emitted
                c.finished += 1
        return events

    # -- observation ---------------------------------------------------------------
    def running_count(self, rank: int) -> int:
        return len(self._running[rank])

    def waiting_count(self, rank: int) -> int:
        return len(self._waiting[rank])

    def running_load_tokens(self, rank: int) -> int:
        """Tokens held by ``rank``'s running requests (the step model's load)."""
        return self._load[rank]

    def load_tokens(self, rank: int) -> int:
        """Tokens held by ``rank``'s running and waiting requests (its KV in use)."""
        waiting = sum(r.prompt_tokens + r.emitted for r in self._waiting[rank])
        return self._load[rank] + waiting

    def rank_of(self, request_id: str) -> int | None:
        req = self._reqs.get(request_id)
        return None if req is None else req.rank

    def idle(self) -> bool:
        return not self._reqs


def first_token(seed: int, prompt_tokens: int, vocab_size: int = 32000) -> tuple[int, str]:
    """The token a prefill returns (index 0 of the output), as ``(id, text)``."""
    tid = token_id(seed, prompt_tokens, vocab_size)
    return tid, token_text(tid)
