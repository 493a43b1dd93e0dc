"""Requests queued at an engine (dispatched ahead) apart from running ones: the
snapshot's fields, the FIFO rule of the state, and what br0 balances (no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from br_serve.core import PromptPool, build_policy
from br_serve.core.policy import PolicyBase, PolicyContext
from br_serve.core.state import ClusterState
from br_serve.core.types import Assignment, ClusterSnapshot, PoolRequest


def _snap(load: list[int], running: list[int], queued_tokens: list[int] | None,
          queued: list[int] | None, slots: int = 6, engine_slots: int | None = 4
          ) -> ClusterSnapshot:
    return ClusterSnapshot.build(load, running, slots, queued_tokens=queued_tokens,
                                 queued_requests=queued, engine_slots=engine_slots)


def test_without_a_queue_every_load_is_the_bound_load() -> None:
    s = ClusterSnapshot.build([100, 50], [2, 1], 4)
    assert s.queued_tokens is None and s.engine_slots is None
    assert s.running_load_tokens().tolist() == [100, 50]
    assert s.entry_load_tokens().tolist() == [100.0, 50.0]


def test_entry_load_prices_the_running_requests_that_leave_before_the_new_one() -> None:
    # rank 0: 4 running (400 tokens), 2 queued (30): the new one waits for 3 to leave
    # rank 1: 4 running (400), none queued: it waits for 1 to leave
    # rank 2: 3 running (300) on 4 engine slots: it starts at once, nobody leaves
    s = _snap([430, 400, 300], [6, 4, 3], [30, 0, 0], [2, 0, 0])
    assert s.running_load_tokens().tolist() == [400, 400, 300]
    assert s.entry_load_tokens().tolist() == pytest.approx([400 - 3 * 100 + 30,
                                                            400 - 100, 300])


def test_the_queued_fields_are_validated_by_name() -> None:
    with pytest.raises(ValueError, match="queued_tokens: give it with queued_requests"):
        _snap([10], [1], [5], None)
    with pytest.raises(ValueError, match=r"queued_tokens: must lie in \[0, load_tokens\]"):
        _snap([10], [1], [11], [1])
    with pytest.raises(ValueError, match=r"queued_requests: must lie in \[0, running"):
        _snap([10], [1], [5], [2])
    with pytest.raises(ValueError, match=r"engine_slots: must lie in \[1, slots\]"):
        _snap([10], [1], [5], [1], slots=4, engine_slots=5)


def _bind(st: ClusterState, rid: str, g: int, prompt: int, order: int | None = None
          ) -> None:
    st.admit(Assignment(rid, g, prompt), PoolRequest(rid, prompt), bound_order=order)


def test_the_rows_bound_after_the_engine_slots_are_queued_in_binding_order() -> None:
    st = ClusterState(2, 4)
    for i, p in enumerate([10, 20, 30, 40]):
        _bind(st, f"a{i}", 0, p)
    _bind(st, "b0", 1, 5)
    q = st.fifo_queued(engine_slots=2)
    assert {st.ids[0][s] for s in np.flatnonzero(q[0])} == {"a2", "a3"}
    assert not q[1].any()
    st.finish("a0")  # the first queued one starts: it keeps its place
    _bind(st, "a4", 0, 50)  # the freed slot row, bound last
    q = st.fifo_queued(engine_slots=2)
    assert {st.ids[0][s] for s in np.flatnonzero(q[0])} == {"a3", "a4"}
    snap = st.snapshot(detail=False, queued=q, engine_slots=2)
    assert snap.queued_tokens is not None and snap.queued_requests is not None
    assert snap.queued_tokens.tolist() == [90, 0]
    assert snap.queued_requests.tolist() == [2, 0]
    assert snap.running_load_tokens().tolist() == [50, 5]


def test_a_row_rebound_at_its_order_keeps_its_place_in_the_queue() -> None:
    st = ClusterState(1, 3)
    _bind(st, "x", 0, 1)
    _bind(st, "y", 0, 1)
    order = st.bound_order_of("x")
    st.finish("x")
    _bind(st, "x", 0, 1, order)
    assert st.fifo_queued(engine_slots=1)[0].sum() == 1
    assert st.ids[0][int(np.flatnonzero(st.fifo_queued(1)[0])[0])] == "y"


def _br0(rule: str) -> PolicyBase[Any]:
    return build_policy("br0", {"queued_load": rule, "hold_budget_ms": 0.0},  # placement, not hold
                        context=PolicyContext(rng=np.random.default_rng(0)))


def test_br0_balances_the_load_at_entry_not_the_bound_load() -> None:
    """Rank 0 runs 4 requests (1000 tokens) with nothing queued; rank 1 runs 4 heavy
    ones (1200) with 2 short ones (100) queued. Counting every bound token rank 0 is
    lighter (1000 < 1300), and so it is counting the running ones (1000 < 1200); but a
    request bound now starts on rank 0 after one of its rows left (750) and on rank 1
    after three heavy ones left and the queued ones run (400): at entry rank 1 is the
    lighter, and that is where ``entry`` sends the one pool request."""
    snap = ClusterSnapshot.build([1000, 1300], [4, 6], 7, queued_tokens=[0, 100],
                                 queued_requests=[0, 2], engine_slots=4)
    assert snap.entry_load_tokens().tolist() == pytest.approx([750, 400])
    picks = {}
    for rule in ("bound", "entry", "running"):
        pool = PromptPool(8)
        pool.add(PoolRequest("big", 300))
        res = _br0(rule).schedule(snap, pool, 0.0, 0)
        picks[rule] = {a.request_id: a.replica for a in res.assignments}
    assert picks == {"bound": {"big": 0}, "entry": {"big": 1}, "running": {"big": 0}}


def test_br0_refuses_an_unknown_queued_load_by_name() -> None:
    with pytest.raises(Exception, match="queued_load"):
        _br0("next")


def test_the_time_cost_prices_the_same_loads_and_counts() -> None:
    from br_serve.core.policies.br0 import balanced_loads
    from br_serve.core.timecost import TimeMargins

    snap = ClusterSnapshot.build([1000, 1300], [4, 6], 7, queued_tokens=[0, 100],
                                 queued_requests=[0, 2], engine_slots=4,
                                 step_a_s_per_token=[1e-3, 2e-3], step_b_s=0.0,
                                 step_c_s_per_request=0.01)
    load, cnt = balanced_loads(snap, "entry")
    assert load.tolist() == pytest.approx([750, 400]) and cnt.tolist() == [3, 3]
    assert [x.tolist() for x in balanced_loads(snap, "running")] == [[1000, 1200], [4, 4]]
    assert [x.tolist() for x in balanced_loads(snap, "bound")] == [[1000, 1300], [4, 6]]
    tm = TimeMargins(snap, load, cnt)
    assert tm.t == pytest.approx([0.75 + 0.03, 0.8 + 0.03])
