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


@given(ops=st.lists(st.tuples(st.sampled_from(["add", "take", "restore"]),
                              st.integers(0, 50)), max_size=120))
def test_restore_puts_a_request_back_as_if_it_never_left(
        ops: list[tuple[str, int]]) -> None:
    """After any mix of adds, removals and restores: FCFS order is insertion order of the
    present requests, and each one's overtake count is the number of newer requests now
    absent (the closed form of the pool's counter when nothing is ever put back)."""
    from br_serve.core.pool import PoolTicket

    pool = PromptPool(capacity=8)
    order: list[str] = []  # every id ever added, in insertion order
    out: dict[str, tuple[PoolRequest, PoolTicket]] = {}
    for op, k in ops:
        present = [r for r in order if r in pool]
        if op == "add" and not pool.is_full():
            rid = f"r{len(order)}"
            pool.add(PoolRequest(rid, k))
            order.append(rid)
        elif op == "take" and present:
            rid = present[k % len(present)]
            ticket = pool.ticket(rid)
            out[rid] = (pool.remove(rid), ticket)
        elif op == "restore" and out:
            rid = sorted(out)[k % len(out)]
            pool.restore(*out.pop(rid))  # capacity is not checked on the way back
    present = [r for r in order if r in pool]
    assert [r.request_id for r in pool.fcfs()] == present
    assert sorted(pool.sorted_sizes) == pool.sorted_sizes
    assert sorted(pool.sorted_ids) == sorted(present)
    for req, overtaken in pool.fcfs_overtaken():
        newer = order[order.index(req.request_id) + 1:]
        assert overtaken == sum(r not in pool for r in newer), req.request_id
    # the prompt-token clock: tokens through each request count every request added up
    # to it, present or not; released tokens are those of the absent ones
    size = {r.request_id: r.prompt_tokens for r in pool.fcfs()}
    size.update({rid: req.prompt_tokens for rid, (req, _) in out.items()})
    assert pool.released_tokens == sum(size[r] for r in order if r not in pool)
    for req in pool.fcfs():
        upto = order[: order.index(req.request_id) + 1]
        assert pool.tokens_through(req.request_id) == sum(size[r] for r in upto)


def test_restore_refuses_a_present_request() -> None:
    pool = PromptPool()
    pool.add(PoolRequest("a", 1))
    with pytest.raises(ValueError, match="already in the pool"):
        pool.restore(PoolRequest("a", 1), pool.ticket("a"))
