"""Overdue requests about as overdue as the most overdue one go by fit (``overdue_band``).

Contract (:func:`br_serve.core.tick.run_two_stage`): overdue requests (urgency >= 1) go
before any other request; with a band, those within it of the highest urgency compete
by F over every open replica; one past the band (more overdue) is not passed over; one
that fits nowhere does not block the rest; without a band, oldest first as before.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.core import ClusterSnapshot, PoolRequest, PromptPool, build_policy
from br_serve.core.policies.br0 import ScalarMargins
from br_serve.core.tick import run_two_stage
from tests.core.strategies import states


def _pool(sizes: list[int]) -> PromptPool:
    pool = PromptPool()
    for i, s in enumerate(sizes):
        pool.add(PoolRequest(f"r{i}", s, arrival_s=0.0))
    return pool


def _one_slot_on_a_short_replica() -> ClusterSnapshot:
    # replica 0 is 100 tokens under the barrier replica 1 and has the only free slot
    return ClusterSnapshot.build([900, 1000], [7, 8], 8)


def _tick(pool: PromptPool, urgency: list[float], band: float | None,
          cluster: ClusterSnapshot | None = None) -> list[str]:
    snap = cluster if cluster is not None else _one_slot_on_a_short_replica()
    starving = list(zip(pool.fcfs(), urgency, strict=True))
    res = run_two_stage(snap, pool, ScalarMargins(snap), s_greedy=2, r_max=4,
                        starving=starving, overdue_band=band)
    return [a.request_id for a in res.assignments]


def test_equally_overdue_requests_go_by_fit_not_age() -> None:
    pool = _pool([900, 100])  # r0 is older; r1 fits the 100-token margin
    assert _tick(pool, [1.0, 1.0], 0.25) == ["r1"]
    assert _tick(pool, [1.0, 1.0], None) == ["r0"]  # oldest first, overflowing


def test_a_request_more_overdue_than_the_band_goes_first_whatever_its_fit() -> None:
    pool = _pool([900, 100])
    assert _tick(pool, [1.5, 1.0], 0.25) == ["r0"]
    assert _tick(pool, [1.2, 1.0], 0.25) == ["r1"]  # within the band: by fit


def test_only_overdue_requests_compete_and_they_go_before_the_rest() -> None:
    # r1 is only past its lead time (0.5): the overdue r0 takes the slot
    pool = _pool([900, 100])
    assert _tick(pool, [1.0, 0.5], 0.25) == ["r0"]


def test_an_overdue_request_that_fits_nowhere_does_not_block_the_rest() -> None:
    snap = ClusterSnapshot.build([900, 1000], [7, 8], 8, kv_limit_tokens=[1500, 2000])
    pool = _pool([900, 100])  # r0 needs 900 of replica 0's 600 free KV tokens
    assert _tick(pool, [2.0, 1.0], 0.25, snap) == ["r1"]
    assert _tick(pool, [2.0, 1.0], None, snap) == ["r1"]


def test_both_policies_default_to_a_quarter_of_a_budget() -> None:
    for name in ("br0", "brh"):
        opts = build_policy(name).options
        assert opts.ageing_overdue_band == 0.25
        off = build_policy(name, {"ageing_overdue_band": None}).options
        assert off.ageing_overdue_band is None


@settings(max_examples=150, deadline=None)
@given(st_=states(max_g=8, kv=True, dead=True), data=st.data(),
       band=st.sampled_from([None, 0.0, 0.25, 10.0]), shallow=st.booleans())
def test_with_a_band_the_tick_keeps_slots_kv_and_every_overdue_request_first(
        st_: tuple[ClusterSnapshot, PromptPool], data: st.DataObject,
        band: float | None, shallow: bool) -> None:
    cluster, pool = st_
    reqs = list(pool.fcfs())
    urg = data.draw(st.lists(st.sampled_from([0.3, 1.0, 1.1, 2.0]), min_size=len(reqs),
                             max_size=len(reqs)))
    starving = list(zip(reqs, urg, strict=True))
    res = run_two_stage(cluster, pool, ScalarMargins(cluster), s_greedy=2, r_max=3,
                        starving=starving, overdue_band=band, shallow=shallow)
    ids = [a.request_id for a in res.assignments]
    assert len(ids) == len(set(ids))
    free = cluster.free_slots
    for g in range(cluster.num_replicas):
        mine = [a for a in res.assignments if a.replica == g]
        assert len(mine) <= free[g]
        assert not mine or cluster.alive[g]
    overdue = {r.request_id for r, u in starving if u >= 1.0}
    placed_overdue = [i for i in ids if i in overdue]
    if band is not None:  # overdue requests go before any other (without a band the
        # starving ones go in FCFS order, a request past its lead time among them)
        assert ids[:len(placed_overdue)] == placed_overdue


def _reference(cluster: ClusterSnapshot, pool: PromptPool,
               starving: list[tuple[PoolRequest, float]], band: float) -> list[tuple[str, int]]:
    """The rule by brute force: every (eligible request, replica that fits it) pair."""
    model = ScalarMargins(cluster)
    free = list(cluster.free_slots)
    room = [int(k) - int(v) for k, v in zip(cluster.kv_limit_tokens, cluster.load_tokens,
                                             strict=True)]
    for g in range(cluster.num_replicas):
        if not cluster.alive[g]:
            free[g] = 0
    due = [(r, u) for r, u in starving if u >= 1.0]
    out: list[tuple[str, int]] = []
    while due and sum(free) > 0:
        floor = max(u for _, u in due) - band
        best: tuple[float, int, int, int] | None = None
        for g in range(cluster.num_replicas):
            if free[g] <= 0:
                continue
            for j, (req, u) in enumerate(due):
                if u >= floor and req.prompt_tokens <= room[g]:
                    f = model.scorer(g)(float(req.prompt_tokens))
                    key = (f, -g, -j)
                    if best is None or key > best[:3]:
                        best = (f, -g, -j, g)
        if best is None:
            due = [(r, u) for r, u in due if u < floor]
            continue
        j, g = -best[2], best[3]
        req = due.pop(j)[0]
        out.append((req.request_id, g))
        free[g] -= 1
        room[g] -= req.prompt_tokens
        model.admit(g, float(req.prompt_tokens), 1)
    return out


def test_the_bisection_finds_the_pair_the_brute_force_finds() -> None:
    import numpy as np

    from tests.core.strategies import random_state

    rng = np.random.default_rng(11)
    for _ in range(300):
        # two alive replicas at least: with one, every F above its peak ties (no
        # barrier to balance), and the rule leaves the order among ties open
        g = int(rng.integers(2, 9))
        cluster, pool = random_state(rng, g, 8, int(rng.integers(1, 80)),
                                     kv_limit=int(rng.choice([4000, 60000])),
                                     dead=int(rng.integers(0, g - 1)))
        reqs = list(pool.fcfs())
        urg = rng.choice([0.5, 1.0, 1.1, 1.3, 2.0], size=len(reqs)).tolist()
        starving = list(zip(reqs, urg, strict=True))
        band = float(rng.choice([0.0, 0.25, 1.0]))
        want = _reference(cluster, pool, starving, band)
        res = run_two_stage(cluster, pool, ScalarMargins(cluster), s_greedy=2, r_max=3,
                            starving=starving, overdue_band=band)
        got = [(a.request_id, a.replica) for a in res.assignments][:len(want)]
        assert got == want
