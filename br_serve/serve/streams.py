"""The ingress side of a request's life: prefill, pool entry, token stream, recovery.

:class:`Streamer` lives in each ingress replica (its ``owner`` id names it to the
decode replicas). One long-poll loop per decode replica fetches every event for this
owner and routes it to the request's queue, so a step costs one RPC per replica, not
one per token.

Contracts of :meth:`Streamer.generate`:
- yields :class:`Token` items with ``index`` 0, 1, 2, ... exactly once each (events
  are de-duplicated by index), ``max_tokens`` of them unless it fails;
- raises :class:`GenerateError` (with an HTTP status) *before* its first item for bad
  input (400, 413), a full pool (429) or no decode replica alive (503);
- after the first item, a failure ends the stream with one :class:`Token` whose
  ``error`` is set. A request on a decode replica that died is re-prefilled with its
  prompt extended by the tokens already produced and finished elsewhere (at most
  ``_MAX_REPREFILL`` times), so the stream continues where it stopped;
- the pool entry stays here until a decode replica confirms admission: if the
  scheduler restarts (its incarnation changes) or forgets the request, it is
  resubmitted. No wait is unbounded: a request silent for ``_WATCHDOG_S`` is located.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from br_serve.engine.base import SamplingParams, TokenEvent
from br_serve.serve.config import GraphConfig
from br_serve.serve.messages import Admission, Admitted, PrefillOutput, StreamError
from br_serve.transport.base import KVHandle

log = logging.getLogger(__name__)

_WATCHDOG_S = 2.0
_MAX_REPREFILL = 2
_SCHEDULER_RETRY_S = 60.0


class GenerateError(Exception):
    """A request failed before streaming began; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param


@dataclass(frozen=True, slots=True)
class Token:
    """One streamed token (or, with ``error`` set, the explicit end of a failed stream)."""

    index: int
    token_id: int
    text: str
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    replica: int = -1
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Lost:
    """Internal queue item: the replica running the request is gone."""

    replica: int


class Streamer:
    """Per-ingress-replica request router (see the module docstring)."""

    def __init__(self, cfg: GraphConfig, prefill: Any, scheduler: Any,
                 decode: list[Any], keeper: Any = None) -> None:
        self.cfg = cfg
        self.prefill = prefill
        self.owner = f"ingress-{uuid.uuid4().hex[:12]}"
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._placement: dict[str, int] = {}
        self._pending: dict[str, Admission] = {}
        self._dead: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._scheduler = scheduler
        self._decode = list(decode)
        self._keeper: Any = keeper
        self._incarnation: str | None = None
        self._seq = 0

    # -- background loops ---------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._poll_loop(g)) for g in range(len(self._decode))]
        self._tasks.append(loop.create_task(self._watch_incarnation()))

    async def _poll_loop(self, g: int) -> None:
        handle = self._decode[g]
        while True:
            try:
                events = await handle.poll.remote(self.owner, 1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("ingress: lost decode replica %d: %s", g, exc)
                self._dead.add(g)
                for rid, where in list(self._placement.items()):
                    if where == g and rid in self._queues:
                        self._queues[rid].put_nowait(_Lost(g))
                with contextlib.suppress(Exception):
                    await self._scheduler.replica_lost.remote(g)
                return
            for ev in events:
                q = self._queues.get(ev.request_id)
                if q is not None:
                    q.put_nowait(ev)
                elif isinstance(ev, Admitted):
                    # nobody waits for it any more (client gone): free the slot
                    handle.abort.remote(ev.request_id)

    async def _watch_incarnation(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            try:
                inc = await self._scheduler.get_incarnation.remote()
            except Exception:
                continue
            if self._incarnation is not None and inc != self._incarnation:
                log.warning("ingress: scheduler restarted; resubmitting %d entries",
                            len(self._pending))
                for entry in list(self._pending.values()):
                    with contextlib.suppress(Exception):
                        await self._scheduler.submit.remote(entry)
            self._incarnation = inc

    async def _call_scheduler(self, method: str, *args: Any) -> Any:
        """Call the scheduler, riding out a restart (bounded)."""
        deadline = time.monotonic() + _SCHEDULER_RETRY_S
        while True:
            try:
                return await getattr(self._scheduler, method).remote(*args)
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise GenerateError(503, f"scheduler unavailable: {exc}",
                                        "service_unavailable") from exc
                await asyncio.sleep(0.2)

    # -- public -----------------------------------------------------------------------
    def new_request_id(self) -> str:
        self._seq += 1
        return f"{self.owner}-{self._seq}"

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncGenerator[Token, None]:
        """Stream the tokens of one request (see the module docstring)."""
        self._ensure_started()
        if len(self._dead) >= len(self._decode):
            raise GenerateError(503, "no decode replica is alive", "service_unavailable")
        base = request_id or self.new_request_id()
        seed = params.seed if params.seed is not None else zlib.crc32(base.encode())
        produced: list[Token] = []
        prompt_tokens = 0
        attempt = 0
        arrival_s = time.time()
        while True:
            rid = base if attempt == 0 else f"{base}.r{attempt}"
            cur = prompt if attempt == 0 else _extend(prompt, produced)
            p = dataclasses.replace(params, max_tokens=params.max_tokens - len(produced),
                                    seed=seed)
            try:
                out: PrefillOutput = await self.prefill.prefill.remote(rid, cur, p)
                if out.error is not None:
                    raise GenerateError(out.error_status, out.error,
                                        param="prompt" if out.error_status == 413 else None)
                if attempt == 0:
                    prompt_tokens = out.prompt_tokens
                first = Token(len(produced), out.first_token_id, out.first_token_text,
                              out.finished, out.finish_reason, prompt_tokens)
                if out.finished:
                    yield first
                    return
                assert out.kv is not None
                entry = Admission(rid, self.owner, out.prompt_tokens, out.first_token_id, p,
                                  out.kv, arrival_s=arrival_s)
                self._queues[rid] = asyncio.Queue()
                status = await self._call_scheduler("submit", entry)
                if status in ("full", "no_replica"):
                    self._drop_kv(out.kv)  # not taken: no replica will ever pull it
                if status == "full":
                    raise GenerateError(429, "prompt pool is full; retry later",
                                        "rate_limit_exceeded")
                if status == "no_replica":
                    raise GenerateError(503, "no decode replica is alive",
                                        "service_unavailable")
                self._pending[rid] = entry
            except GenerateError as exc:
                self._queues.pop(rid, None)
                if not produced:
                    raise
                yield Token(len(produced), -1, "", True, "error", prompt_tokens,
                            error=exc.message)
                return
            produced.append(first)
            outcome = ""
            try:
                # inside the try: a client gone at the first token still drops its
                # pool entry and KV (_forget), else both leak and a scheduler restart
                # would resubmit it
                yield first
                async for tok in self._follow(rid, entry, len(produced) - 1, prompt_tokens):
                    if tok.error is not None:
                        outcome = tok.error
                        break
                    produced.append(tok)
                    yield tok
                    if tok.finished:
                        return
            finally:
                self._forget(rid)
            attempt += 1
            if attempt > _MAX_REPREFILL or outcome.startswith("fatal"):
                yield Token(len(produced), -1, "", True, "error", prompt_tokens,
                            error=f"request failed on the decode side: {outcome}")
                return
            log.warning("ingress: re-prefilling %s after %s (%d tokens done)", base,
                        outcome, len(produced))

    # -- internals --------------------------------------------------------------------
    async def _follow(self, rid: str, entry: Admission, offset: int,
                      prompt_tokens: int) -> AsyncIterator[Token]:
        """Tokens of one attempt. Yields an ``error`` token when the attempt is lost:
        ``"lost: ..."`` is retryable, ``"fatal: ..."`` is not."""
        q = self._queues[rid]
        nxt = 1  # engine index of the next expected token (0 came from prefill)
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), _WATCHDOG_S)
            except TimeoutError:
                lost = await self._check(rid, entry)
                if lost:
                    yield Token(-1, -1, "", error=lost)
                    return
                continue
            if isinstance(ev, Admitted):
                prev = self._placement.get(rid)
                if prev is not None and prev != ev.replica:
                    self._decode[ev.replica].abort.remote(rid)  # duplicate admission
                    continue
                self._placement[rid] = ev.replica
                self._pending.pop(rid, None)
                if ev.replica in self._dead:
                    yield Token(-1, -1, "", error=f"lost: replica {ev.replica} died")
                    return
            elif isinstance(ev, _Lost):
                if self._placement.get(rid) == ev.replica:
                    yield Token(-1, -1, "", error=f"lost: replica {ev.replica} died")
                    return
            elif isinstance(ev, StreamError):
                kind = "lost" if ev.retryable else "fatal"
                yield Token(-1, -1, "", error=f"{kind}: {ev.message}")
                return
            elif isinstance(ev, TokenEvent):
                if ev.index != nxt:
                    continue  # duplicate (or stale) delivery
                nxt += 1
                yield Token(offset + ev.index, ev.token_id, ev.text, ev.finished,
                            ev.finish_reason, prompt_tokens, self._placement.get(rid, -1))

    async def _check(self, rid: str, entry: Admission) -> str:
        """Watchdog: where is ``rid``? Resubmits a forgotten pool entry; '' if fine."""
        where = self._placement.get(rid)
        if where is not None and where in self._dead:
            return f"lost: replica {where} died"
        state, _g = await self._call_scheduler("locate", rid)
        if state == "unknown":
            if rid in self._pending:
                status = await self._call_scheduler("submit", entry)
                if status == "no_replica":
                    return "fatal: no decode replica is alive"
            elif where is not None:
                return f"lost: replica {where} no longer runs it"
        return ""

    def _forget(self, rid: str) -> None:
        self._queues.pop(rid, None)
        entry = self._pending.pop(rid, None)
        if entry is not None:
            self._drop_kv(entry.kv)  # never admitted: free its KV
        g = self._placement.pop(rid, None)
        if g is not None and g not in self._dead:
            # no-op if it finished; frees the slot if the client went away
            self._decode[g].abort.remote(rid)
        elif g is None and self._scheduler is not None:
            self._scheduler.cancel.remote(rid)

    def _drop_kv(self, kv: KVHandle) -> None:
        """Free a KV no decode replica has pulled (fire-and-forget; a pull already in
        flight then fails and its replica reports a retryable error to a gone owner).

        The keeper drops its object refs; a key-holding transport (Mooncake) needs an
        explicit release, which the ingress asks of any live decode replica because it
        has no transport of its own.
        """
        if self._keeper is not None:
            self._keeper.release.remote(kv.key)
        if kv.transport == "objref":
            return
        for g, handle in enumerate(self._decode):
            if g not in self._dead:
                handle.release_kv.remote(kv)
                return
        log.warning("ingress: no live decode replica to release kv %r", kv.key)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()


def _extend(prompt: str | list[int], produced: list[Token]) -> str | list[int]:
    """The prompt a re-prefill continues from: original prompt + tokens produced."""
    if isinstance(prompt, str):
        return prompt + "".join(t.text for t in produced)
    return [*prompt, *(t.token_id for t in produced)]
