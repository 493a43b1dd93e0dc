"""Plain-data messages and snapshots shared by the core, the simulator and the actors.

Everything here is a frozen, slotted dataclass. Arrays inside snapshots are numpy
arrays that callers must treat as read-only (the constructors below mark them so).
Units are in the names: ``_tokens`` for KV tokens, ``_s`` for seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: Stand-in for "no KV limit" in integer arrays (far above any real KV budget).
UNLIMITED_TOKENS = np.iinfo(np.int64).max // 4


def _frozen(a: npt.ArrayLike, dtype: type) -> npt.NDArray[Any]:
    arr: npt.NDArray[Any] = np.array(a, dtype=dtype, copy=True)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True)
class PoolRequest:
    """A prefilled request waiting in the prompt pool for a decode slot.

    ``prompt_tokens`` is the KV size it brings (its initial load). ``enqueued_s`` and
    ``enqueued_tick`` date its entry into the pool (for the ``max_wait`` ageing rule).
    ``prefix_hash`` / ``hash_ids`` are optional prompt-prefix keys for predictors.
    """

    request_id: str
    prompt_tokens: int
    enqueued_s: float = 0.0
    enqueued_tick: int = 0
    arrival_s: float = 0.0
    prefix_hash: int | None = None
    hash_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """Bind ``request_id`` (``prompt_tokens`` long) to decode replica ``replica``."""

    request_id: str
    replica: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class RunningRequests:
    """Flat, per-request view of every request running on any replica.

    Row ``j`` is one request: on replica ``replica[j]``, prompt ``prompt_tokens[j]``,
    ``decoded_tokens[j]`` generated so far. ``prefix_hash`` uses -1 for "unknown".
    ``true_remaining_steps`` is filled only by the simulator (the oracle hook); a real
    cluster leaves it ``None``.
    """

    replica: IntArray
    prompt_tokens: IntArray
    decoded_tokens: IntArray
    arrival_s: FloatArray
    prefix_hash: IntArray
    request_ids: tuple[str, ...] = ()
    hash_ids: tuple[tuple[int, ...] | None, ...] | None = None
    true_remaining_steps: IntArray | None = None

    @staticmethod
    def empty() -> RunningRequests:
        z = _frozen([], np.int64)
        return RunningRequests(
            replica=z,
            prompt_tokens=z,
            decoded_tokens=z,
            arrival_s=_frozen([], np.float64),
            prefix_hash=z,
        )

    @staticmethod
    def build(
        replica: npt.ArrayLike,
        prompt_tokens: npt.ArrayLike,
        decoded_tokens: npt.ArrayLike,
        arrival_s: npt.ArrayLike | None = None,
        prefix_hash: npt.ArrayLike | None = None,
        request_ids: tuple[str, ...] = (),
        hash_ids: tuple[tuple[int, ...] | None, ...] | None = None,
        true_remaining_steps: npt.ArrayLike | None = None,
    ) -> RunningRequests:
        """Validate shapes and freeze copies of the arrays.

        Raises:
            ValueError: arrays of different lengths, or negative token counts.
        """
        rep = _frozen(replica, np.int64)
        n = rep.shape[0]
        pt = _frozen(prompt_tokens, np.int64)
        dt = _frozen(decoded_tokens, np.int64)
        arr = _frozen(np.zeros(n) if arrival_s is None else arrival_s, np.float64)
        ph = _frozen(np.full(n, -1) if prefix_hash is None else prefix_hash, np.int64)
        tr = None if true_remaining_steps is None else _frozen(true_remaining_steps, np.int64)
        for name, a in (("prompt_tokens", pt), ("decoded_tokens", dt), ("arrival_s", arr),
                        ("prefix_hash", ph)):
            if a.shape != (n,):
                raise ValueError(f"running.{name}: shape {a.shape}, expected ({n},)")
        if tr is not None and tr.shape != (n,):
            raise ValueError(f"running.true_remaining_steps: shape {tr.shape}, expected ({n},)")
        if request_ids and len(request_ids) != n:
            raise ValueError(f"running.request_ids: {len(request_ids)} ids for {n} rows")
        if n and (pt.min() < 0 or dt.min() < 0):
            raise ValueError("running: token counts must be >= 0")
        return RunningRequests(
            replica=rep,
            prompt_tokens=pt,
            decoded_tokens=dt,
            arrival_s=arr,
            prefix_hash=ph,
            request_ids=request_ids,
            hash_ids=hash_ids,
            true_remaining_steps=tr,
        )

    def __len__(self) -> int:
        return int(self.replica.shape[0])


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """What a policy sees of the ``G`` decode replicas at one tick.

    Invariants (checked by :meth:`build`): every array has shape ``(G,)``;
    ``0 <= running_requests <= slots``; ``load_tokens >= 0``. ``kv_limit_tokens`` uses
    :data:`UNLIMITED_TOKENS` for "no limit". Dead replicas (``alive == False``) receive
    nothing but still count in the barrier only if alive.
    ``running`` carries per-request detail for look-ahead policies (may be empty for
    policies that only need replica totals).
    """

    load_tokens: IntArray
    running_requests: IntArray
    slots: IntArray
    kv_limit_tokens: IntArray
    alive: BoolArray
    step_a_s_per_token: FloatArray
    step_b_s: FloatArray
    step_c_s_per_request: FloatArray
    running: RunningRequests = field(default_factory=RunningRequests.empty)
    queued_tokens: IntArray | None = None
    queued_requests: IntArray | None = None
    engine_slots: IntArray | None = None

    @property
    def num_replicas(self) -> int:
        return int(self.load_tokens.shape[0])

    def running_load_tokens(self) -> IntArray:
        """``load_tokens`` less the queued requests' tokens: what the barrier computes
        with now."""
        if self.queued_tokens is None:
            return self.load_tokens
        out: IntArray = self.load_tokens - self.queued_tokens
        return out

    def entry_load_tokens(self) -> FloatArray:
        """Each replica's load when a request bound to it now starts to decode.

        Without a queue (``queued_tokens`` None) that is ``load_tokens``. With one, the
        new request waits behind the ``q`` queued ones and starts when a running one
        leaves for each of them and for itself (``n + q + 1 - engine_slots`` leave,
        none while the engine has a free slot); by then the queued ones run. A leaving
        request is priced at its replica's mean running row (prediction-free):
        ``running - leave * running / n + queued``. This is what br0 balances with
        ``queued_load="entry"``.
        """
        if self.queued_tokens is None or self.queued_requests is None:
            return self.load_tokens.astype(np.float64)
        cap = self.slots if self.engine_slots is None else self.engine_slots
        run_n = self.running_requests - self.queued_requests
        run_load = (self.load_tokens - self.queued_tokens).astype(np.float64)
        leave = np.clip(run_n + self.queued_requests + 1 - cap, 0, run_n)
        mean_row = run_load / np.maximum(run_n, 1)
        out: FloatArray = run_load - leave * mean_row + self.queued_tokens
        return out

    def entry_running_requests(self) -> FloatArray:
        """Each replica's running requests when a request bound now starts (itself not
        counted): see :meth:`entry_load_tokens`."""
        run: FloatArray = self.running_requests.astype(np.float64)
        if self.queued_tokens is None or self.queued_requests is None:
            return run
        cap = self.slots if self.engine_slots is None else self.engine_slots
        run_n = self.running_requests - self.queued_requests
        leave = np.clip(run_n + self.queued_requests + 1 - cap, 0, run_n)
        out: FloatArray = (run_n - leave + self.queued_requests).astype(np.float64)
        return out

    @property
    def free_slots(self) -> IntArray:
        free: IntArray = np.where(self.alive, self.slots - self.running_requests, 0)
        return free

    @staticmethod
    def build(
        load_tokens: npt.ArrayLike,
        running_requests: npt.ArrayLike,
        slots: npt.ArrayLike | int,
        kv_limit_tokens: npt.ArrayLike | int | None = None,
        alive: npt.ArrayLike | None = None,
        step_a_s_per_token: npt.ArrayLike | float = 5e-7,
        step_b_s: npt.ArrayLike | float = 0.03,
        running: RunningRequests | None = None,
        step_c_s_per_request: npt.ArrayLike | float = 0.0,
        queued_tokens: npt.ArrayLike | None = None,
        queued_requests: npt.ArrayLike | None = None,
        engine_slots: npt.ArrayLike | int | None = None,
    ) -> ClusterSnapshot:
        """Broadcast scalars to ``(G,)``, validate and freeze.

        ``queued_tokens`` / ``queued_requests``: the part of ``load_tokens`` /
        ``running_requests`` that is bound to a replica but waits in its engine's queue
        (dispatched ahead, not yet decoding); ``engine_slots``: how many requests the
        engine runs at once (``slots`` counts the queue's places too). None: no queue.

        Raises:
            ValueError: naming the field that is inconsistent.
        """
        load = _frozen(load_tokens, np.int64)
        g = load.shape[0]
        if load.ndim != 1 or g < 1:
            raise ValueError("load_tokens: need a 1-D array with at least one replica")

        def bcast(v: npt.ArrayLike | float | None, default: float, dt: type
                  ) -> npt.NDArray[Any]:
            val: npt.NDArray[Any] = np.asarray(default if v is None else v, dtype=dt)
            return _frozen(np.broadcast_to(val, (g,)), dt)

        run = _frozen(running_requests, np.int64)
        sl = bcast(slots, 0, np.int64)
        kv = bcast(kv_limit_tokens, float(UNLIMITED_TOKENS), np.int64)
        al = bcast(alive, True, np.bool_)
        a = bcast(step_a_s_per_token, 5e-7, np.float64)
        b = bcast(step_b_s, 0.03, np.float64)
        c = bcast(step_c_s_per_request, 0.0, np.float64)
        if run.shape != (g,):
            raise ValueError(f"running_requests: shape {run.shape}, expected ({g},)")
        if (load < 0).any():
            raise ValueError("load_tokens: must be >= 0")
        if (sl < 1).any():
            raise ValueError("slots: every replica needs at least one slot")
        if (run < 0).any() or (run > sl).any():
            raise ValueError("running_requests: must lie in [0, slots]")
        if (kv < 1).any():
            raise ValueError("kv_limit_tokens: must be >= 1")
        qt = qn = es = None
        if (queued_tokens is None) != (queued_requests is None):
            raise ValueError("queued_tokens: give it with queued_requests, or neither")
        if queued_tokens is not None:
            qt = _frozen(np.broadcast_to(np.asarray(queued_tokens, dtype=np.int64), (g,)),
                         np.int64)
            qn = _frozen(np.broadcast_to(np.asarray(queued_requests, dtype=np.int64), (g,)),
                         np.int64)
            if (qt < 0).any() or (qt > load).any():
                raise ValueError("queued_tokens: must lie in [0, load_tokens]")
            if (qn < 0).any() or (qn > run).any():
                raise ValueError("queued_requests: must lie in [0, running_requests]")
        if engine_slots is not None:
            es = bcast(engine_slots, 0, np.int64)
            if (es < 1).any() or (es > sl).any():
                raise ValueError("engine_slots: must lie in [1, slots]")
        return ClusterSnapshot(
            load_tokens=load,
            running_requests=run,
            slots=sl,
            kv_limit_tokens=kv,
            alive=al,
            step_a_s_per_token=a,
            step_b_s=b,
            step_c_s_per_request=c,
            running=RunningRequests.empty() if running is None else running,
            queued_tokens=qt,
            queued_requests=qn,
            engine_slots=es,
        )


@dataclass(frozen=True, slots=True)
class TickResult:
    """The outcome of one scheduling tick: assignments in decision order, plus counters.

    ``stage1`` / ``stage2`` count assignments made by each stage, ``guard`` those forced
    by the starvation guard, ``aged`` those placed first by ageing, ``shallow`` those
    placed one by one in a shallow pool. ``predictor_ok`` is False when a look-ahead
    policy fell back to the closed gate this tick; ``lookahead`` is False when it used
    BR-0's decision because the look-ahead was not trusted.

    ``held`` counts pool requests the policy chose not to place although a slot was
    free (a bounded hold); ``retick_s`` asks the driver to tick again at that time (its
    clock, as ``now_s``) even if nothing else changes, so a hold ends on time. A driver
    that ticks on events only must honour it; ``None``: no request.
    """

    assignments: tuple[Assignment, ...]
    stage1: int = 0
    stage2: int = 0
    guard: int = 0
    aged: int = 0
    predictor_ok: bool = True
    shallow: int = 0
    held: int = 0
    retick_s: float | None = None
    lookahead: bool = True

    def flagged(self, predictor_ok: bool, lookahead: bool) -> TickResult:
        """This result with the two look-ahead flags set (``dataclasses.replace``'s
        field introspection costs a noticeable share of a tick)."""
        return TickResult(self.assignments, self.stage1, self.stage2, self.guard, self.aged,
                          predictor_ok, self.shallow, self.held, self.retick_s, lookahead)
