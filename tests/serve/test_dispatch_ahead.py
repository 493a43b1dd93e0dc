"""Dispatch ahead (``pool.dispatch_ahead``): the scheduler binds up to ``slots + d``
requests per decode rank, the engine queues the extra ones (no Ray)."""

from __future__ import annotations

import pytest

from br_serve.core import build_policy
from br_serve.core.step import StepModel
from br_serve.engine.base import SamplingParams
from br_serve.serve.config import DISPATCH_AHEAD_REMOTE, GraphConfigError, parse_graph_config
from br_serve.serve.replica.book import ReplicaBook
from br_serve.serve.scheduler.core import SchedulerCore
from br_serve.serve.wire.messages import Admission, AdmitReply, ReplicaReport
from br_serve.transport.base import KVHandle

REMOTE = {"engine": "sglang", "remote_prefill_urls": "http://127.0.0.1:1",
          "remote_decode_urls": "http://127.0.0.1:2", "remote_dp_size": "2", "slots": "4"}


def test_default_depth_is_remote_only_and_counts_in_the_places() -> None:
    local = parse_graph_config({"slots": "4"})
    assert local.dispatch_ahead() == 0 and local.places_per_replica() == 4
    remote = parse_graph_config(REMOTE)
    assert remote.dispatch_ahead() == DISPATCH_AHEAD_REMOTE > 0
    assert remote.places_per_replica() == 4 + DISPATCH_AHEAD_REMOTE
    off = parse_graph_config({**REMOTE, "pool_dispatch_ahead": "0"})
    assert off.places_per_replica() == 4
    assert parse_graph_config({**REMOTE, "pool.dispatch_ahead": "5"}).dispatch_ahead() == 5
    # a benchmark's base config resolves the depth of the graph it starts remote
    assert local.dispatch_ahead(remote=True) == DISPATCH_AHEAD_REMOTE
    assert remote.dispatch_ahead(remote=False) == 0
    assert off.dispatch_ahead(remote=True) == 0


@pytest.mark.parametrize("value", ["1", "3"])
def test_a_depth_for_engines_without_a_queue_is_refused_by_name(value: str) -> None:
    with pytest.raises(GraphConfigError, match=r"^pool\.dispatch_ahead: only for engine"):
        parse_graph_config({"slots": "4", "pool_dispatch_ahead": value})
    assert parse_graph_config({"pool_dispatch_ahead": "0"}).dispatch_ahead() == 0


def test_a_negative_depth_names_the_field() -> None:
    with pytest.raises(GraphConfigError, match=r"pool\.dispatch_ahead"):
        parse_graph_config({**REMOTE, "pool_dispatch_ahead": "-1"})


def _admission(rid: str, prompt: int) -> Admission:
    return Admission(rid, "o", prompt, 0, SamplingParams(max_tokens=4),
                     KVHandle("fake", rid, prompt))


def _report(g: int, running: tuple[str, ...], finished: tuple[str, ...], step: int
            ) -> ReplicaReport:
    return ReplicaReport(
        replica=g, generation=0, step=step, load_tokens=0, running_ids=running,
        prompt_tokens=(10,) * len(running), decoded_tokens=(1,) * len(running),
        finished_ids=finished, finished_output_tokens=(2,) * len(finished), members=(),
        barrier_loads=(), barrier_running=(), compute_s=0.0, barrier_s=0.0,
        incarnation=f"i{g}", full=False)


def _core(slots: int, depth: int) -> SchedulerCore:
    core = SchedulerCore(2, slots + depth, 64, StepModel(1e-3, 0.01, 0.0),
                         build_policy("jsq"), detail=False,
                         clock=iter(range(10**6)).__next__)
    for g in range(2):
        core.mark_alive(g, f"i{g}")
    return core


def _tick_all(core: SchedulerCore) -> list[tuple[int, str]]:
    out = []
    for d in core.tick():
        core.answered(d, AdmitReply("queued", 0, f"i{d.replica}"))
        out.append((d.replica, d.admission.request_id))
    return out


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_the_scheduler_binds_slots_plus_depth_per_rank_and_the_rest_waits(depth: int) -> None:
    """With every slot busy, ``depth`` more per rank are bound (and count in the
    rank's load, which the policy balances); the others stay in the pool until a
    report frees a place; a finish frees one place, refilled at the next tick."""
    slots = 2
    core = _core(slots, depth)
    for i in range(10):
        assert core.submit(_admission(f"r{i}", 10 + i)) == "queued"
    sent = _tick_all(core)
    per_rank = [sum(1 for g, _ in sent if g == r) for r in range(2)]
    assert per_rank == [slots + depth] * 2
    assert len(core.pool) == 10 - 2 * (slots + depth)
    st = core.state()
    assert [r["free_slots"] for r in st["replicas"]] == [0, 0]
    # the bound-ahead requests count in the load the policy sees
    assert sum(r["load_tokens"] for r in st["replicas"]) == sum(
        10 + int(rid[1:]) for _, rid in sent)
    assert _tick_all(core) == []  # no place left: nothing more is bound
    # rank 0 reports: its first `slots` run (the engine holds the rest queued), and one
    # of them finished; exactly one place frees and the next tick binds one request
    mine = [rid for g, rid in sent if g == 0]
    core.on_report(_report(0, tuple(mine[1:]), (mine[0],), step=1))
    again = _tick_all(core)
    assert [g for g, _ in again] == [0]
    assert len(core.pool) == 10 - 2 * (slots + depth) - 1


def test_the_replica_book_takes_the_places_and_installs_every_taken_request() -> None:
    """The book of a rank with ``slots + depth`` places accepts that many, refuses the
    next (``full``: the scheduler puts it back), and hands every pulled one to the
    engine, which queues what exceeds its slots."""
    book = ReplicaBook(4 + 2)
    for i in range(6):
        assert book.accept(f"r{i}", "o") == "queued"
        assert book.pulled(_admission(f"r{i}", 5), object())
    assert book.accept("r6", "o") == "full"
    installs, aborts = book.take_work()
    assert [a.request_id for a, _ in installs] == [f"r{i}" for i in range(6)]
    assert aborts == [] and book.taken() == 6


def _queue_core(policy: str, slots: int = 2, depth: int = 2) -> SchedulerCore:
    """Two ranks of ``slots`` engine slots and ``depth`` queue places each."""
    core = SchedulerCore(2, slots + depth, 64, StepModel(1e-3, 0.01, 0.0),
                         build_policy(policy), detail=True,
                         clock=iter(range(10**6)).__next__, engine_slots=slots)
    for g in range(2):
        core.mark_alive(g, f"i{g}")
    return core


def test_the_last_requests_bind_late_not_into_the_queue_of_the_first_reporter() -> None:
    """The G = 8 under-fill (docs/peers.md): with the pool draining, a rank whose
    running requests finish first used to get the pool's last requests in its queue
    places, behind requests that had just started, while the other ranks were about to
    free slots and then idled. Queue places now take only the pool's backlog beyond
    ``d`` per rank: the rest waits for a free engine slot, wherever it comes first."""
    core = _queue_core("jsq")
    for i in range(12):
        assert core.submit(_admission(f"r{i}", 10)) == "queued"
    sent = _tick_all(core)
    # engine slots first (2 per rank), then the queue places for the backlog of 8
    assert sorted(sum(1 for g, _ in sent if g == r) for r in range(2)) == [4, 4]
    assert len(core.pool) == 4
    mine = [rid for g, rid in sent if g == 0]
    # rank 0's two running finish: its queued two start, two queue places free; the
    # pool (4) is no deeper than the ranks' queue places (2 x 2): nothing is bound ahead
    core.on_report(_report(0, tuple(mine[2:]), tuple(mine[:2]), step=1))
    assert _tick_all(core) == []
    # a third finish frees an engine slot: exactly one request binds, there
    core.on_report(_report(0, tuple(mine[3:]), (mine[2],), step=2))
    assert [g for g, _ in _tick_all(core)] == [0]
    assert len(core.pool) == 3


@pytest.mark.parametrize("rule", ["bound", "entry"])
def test_a_free_engine_slot_is_offered_before_a_queue_place(rule: str) -> None:
    """Rank 0 runs two short requests (engine full, queue empty); rank 1 runs one long
    one (an engine slot free). br0 balances tokens and would queue the next request at
    rank 0, where it waits for a departure, while rank 1 could run it now: the
    scheduler offers only the free engine slot."""
    core = _queue_core("br0")
    core.policy = build_policy("br0", {"queued_load": rule})
    for rid, prompt in (("a", 10), ("b", 10), ("c", 5000)):
        assert core.submit(_admission(rid, prompt)) == "queued"
    first = _tick_all(core)
    assert len(first) == 3 and len(core.pool) == 0
    by = {rid: g for g, rid in first}
    long_g = by["c"]
    assert by["a"] == by["b"] == 1 - long_g  # balanced by tokens: the short ones pair
    for i in range(6):
        assert core.submit(_admission(f"n{i}", 10)) == "queued"
    again = _tick_all(core)
    # the one free engine slot first; the queue places only for the backlog beyond
    # 2 x 2: 6 - 1 = 5 in the pool, so one more may queue
    assert again[0][0] == long_g
    assert len(again) == 2
