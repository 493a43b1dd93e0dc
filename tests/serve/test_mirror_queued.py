"""The mirror with engine queues (``pool.dispatch_ahead``): rows bound beyond a rank's
engine slots are queued, do not decode, and the snapshot tells them apart (no Ray)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import Assignment, PoolRequest
from br_serve.core.pool import PromptPool
from br_serve.core.step import StepModel
from br_serve.serve.scheduler.mirror import Mirror
from br_serve.serve.wire.messages import ReplicaReport
from tests.serve.test_mirror import OPS, World


def _report(step: int, running: tuple[str, ...], decoded: tuple[int, ...],
            finished: tuple[str, ...] = (), full: bool = True) -> ReplicaReport:
    return ReplicaReport(
        replica=0, generation=1, step=step, load_tokens=0, running_ids=running,
        prompt_tokens=(100,) * len(running), decoded_tokens=decoded,
        finished_ids=finished, finished_output_tokens=(9,) * len(finished),
        members=(0,), barrier_loads=(), barrier_running=(), compute_s=0.0,
        barrier_s=0.0, incarnation="i0", barrier_step=step, full=full)


def _mirror(engine_slots: int | None) -> Mirror:
    m = Mirror(1, 3, StepModel(), engine_slots=engine_slots)
    m.set_alive(0, "i0")
    pool = PromptPool(8)
    for rid in ("a", "b", "c"):
        pool.add(PoolRequest(rid, 100))
        ticket = pool.ticket(rid)
        m.dispatch(Assignment(rid, 0, 100), pool.remove(rid), ticket)
    return m


def test_engine_slots_must_fit_the_places() -> None:
    with pytest.raises(ValueError, match="engine_slots"):
        Mirror(1, 3, StepModel(), engine_slots=4)


def test_queued_rows_do_not_decode_and_the_snapshot_shows_them() -> None:
    m = _mirror(engine_slots=2)
    m.apply_report(_report(1, ("a", "b", "c"), (1, 1, 0)))
    m.advance((0,), 1, 6)  # five more steps: a and b decode, c waits
    st = m.state
    assert [int(st.decoded[st.where(r)]) for r in "abc"] == [6, 6, 0]
    snap = m.snapshot(detail=False)
    assert snap.queued_requests is not None and snap.queued_tokens is not None
    assert snap.queued_requests.tolist() == [1] and snap.queued_tokens.tolist() == [100]
    assert snap.engine_slots is not None and snap.engine_slots.tolist() == [2]
    assert snap.running_load_tokens().tolist() == [212]
    # a finishes: c starts (FIFO) and decodes from the next step on
    m.apply_report(_report(7, ("c",), (0,), finished=("a",), full=False))
    m.advance((0,), 1, 9)
    assert [int(st.decoded[st.where(r)]) for r in "bc"] == [9, 2]
    snap = m.snapshot(detail=False)
    assert snap.queued_requests is not None and snap.queued_requests.tolist() == [0]


def test_without_engine_slots_every_row_decodes_as_before() -> None:
    m = _mirror(engine_slots=None)
    m.apply_report(_report(1, ("a", "b", "c"), (1, 1, 0)))
    m.advance((0,), 1, 6)
    st = m.state
    assert [int(st.decoded[st.where(r)]) for r in "abc"] == [6, 6, 5]
    assert m.snapshot(detail=False).queued_tokens is None


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), max_size=150),
       replicas=st.integers(1, 3))
def test_with_an_engine_queue_every_slot_is_free_after_everything_finishes(
        replicas: int, ops: list[tuple[str, int]]) -> None:
    """test_mirror's interleavings (any order of submits, ticks, calls, pulls, replies,
    steps, reports, cancels, kills) with one of the two places per rank counted as the
    engine's queue: the snapshot always splits, and nothing leaks (the fake engine
    runs both, so what a queued row decodes is not checked here)."""
    w = World(replicas, "br0")
    w.core.mirror.engine_slots = 1  # as SchedulerCore(..., engine_slots=1) builds it
    for op, k in ops:
        w.apply(op, k)
        snap = w.core.mirror.snapshot(detail=False)
        assert snap.queued_requests is not None and snap.queued_tokens is not None
        assert (snap.running_requests - snap.queued_requests <= 1).all()
    w.drain()
    m = w.core.mirror
    assert m.state.running_requests().sum() == 0 and m.inflight_count() == 0
    assert m.expired == 0 and not m._requests and w.live == set()
