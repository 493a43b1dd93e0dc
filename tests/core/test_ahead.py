"""Which places a tick offers under dispatch ahead (:mod:`br_serve.core.ahead`): engine
slots first, queue places only for the pool's backlog (no Ray)."""

from __future__ import annotations

from br_serve.core.ahead import engine_free, engine_slots_only, queue_room
from br_serve.core.types import ClusterSnapshot


def _snap(running: list[int], alive: list[bool] | None = None,
          engine_slots: int | None = 4) -> ClusterSnapshot:
    """Replicas of 4 engine slots and 2 queue places (6 places)."""
    return ClusterSnapshot.build([10 * n for n in running], running, 6, alive=alive,
                                 engine_slots=engine_slots)


def test_without_a_queue_nothing_changes() -> None:
    s = _snap([3, 6], engine_slots=None)
    assert engine_slots_only(s) is s
    assert engine_free(s).tolist() == [3, 0]
    assert queue_room(s, 100) == 0


def test_only_free_engine_slots_are_offered_while_one_exists() -> None:
    s = _snap([4, 2, 5])
    assert engine_free(s).tolist() == [0, 2, 0]
    e = engine_slots_only(s)
    # a queued rank keeps its rows (slots never below running), offers nothing
    assert e.free_slots.tolist() == [0, 2, 0]
    assert e.running_requests.tolist() == [4, 2, 5]
    assert queue_room(s, 100) == 0  # an engine slot is free: no queue place


def test_queue_places_take_only_the_backlog_beyond_d_per_alive_rank() -> None:
    s = _snap([4, 4, 5])  # every engine full; 2 + 2 + 1 queue places free
    assert queue_room(s, 6) == 0   # 6 = 3 ranks x d: nothing is bound ahead
    assert queue_room(s, 7) == 1
    assert queue_room(s, 9) == 3
    assert queue_room(s, 100) == 5  # never more than the free places
    dead = _snap([4, 4, 0], alive=[True, True, False])
    assert engine_free(dead).tolist() == [0, 0, 0]  # a dead rank offers nothing
    assert queue_room(dead, 5) == 1  # its queue places do not count either
