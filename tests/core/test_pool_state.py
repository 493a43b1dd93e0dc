"""PromptPool orderings and ClusterState bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from br_serve.core import UNLIMITED_TOKENS, Assignment, PoolFullError, PoolRequest, PromptPool
from br_serve.core.state import ClusterState


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=80))
def test_pool_keeps_both_orders(ops: list[tuple[bool, int]]) -> None:
    pool = PromptPool()
    model: dict[str, int] = {}
    n = 0
    for add, size in ops:
        if add or not model:
            rid = f"r{n}"
            n += 1
            pool.add(PoolRequest(rid, size))
            model[rid] = size
        else:
            rid = sorted(model)[size % len(model)]
            assert pool.remove(rid).prompt_tokens == model.pop(rid)
    assert pool.sorted_sizes == sorted(model.values())
    assert sorted(pool.sorted_ids) == sorted(model)
    assert [model[i] for i in pool.sorted_ids] == pool.sorted_sizes
    assert [r.request_id for r in pool.fcfs()] == list(model)


def test_pool_errors() -> None:
    pool = PromptPool(capacity=1)
    pool.add(PoolRequest("a", 3))
    with pytest.raises(ValueError, match="request_id"):
        pool.add(PoolRequest("a", 3))
    with pytest.raises(PoolFullError):
        pool.add(PoolRequest("b", 3))
    with pytest.raises(ValueError, match="capacity"):
        PromptPool(capacity=0)


def test_cluster_state_loads_and_limits() -> None:
    st_ = ClusterState(2, slots=2)
    st_.admit(Assignment("a", 0, 100), output_tokens=3)
    st_.admit(Assignment("b", 0, 50), output_tokens=1)
    st_.admit(Assignment("c", 1, 10))
    with pytest.raises(ValueError, match="no free slot"):
        st_.admit(Assignment("d", 0, 1))
    with pytest.raises(ValueError, match="already running"):
        st_.admit(Assignment("c", 1, 1))
    st_.advance(1)
    assert st_.load_tokens().tolist() == [152, 11]
    assert st_.finished_by_target() == ["b"]
    assert st_.finish("b") == (50, 1)
    snap = st_.snapshot(oracle=True)
    assert snap.free_slots.tolist() == [1, 1]
    rem = snap.running.true_remaining_steps
    assert rem is not None
    assert sorted(zip(snap.running.request_ids, rem.tolist(),
                      strict=True)) == [("a", 2), ("c", UNLIMITED_TOKENS)]
    assert st_.set_alive(1, False) == ["c"]
    assert st_.snapshot().free_slots.tolist() == [1, 0]
