"""Per-window capacity and its paired comparison, on answers known by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from br_serve.sim import parse_sim_config
from br_serve.sim.capacity import SLO, Bracket
from br_serve.sim.capacity_paired import compare, paired_capacity
from br_serve.sim.runner import RunSpec
from br_serve.traces import Trace

SKIP = "tests.sim.known_policies.SkipLast"


def _flat(n: int, gap_s: float = 1.0) -> Trace:
    return Trace.build(gap_s * np.arange(n, dtype=float), np.full(n, 100), np.full(n, 10),
                       source="flat")


def test_each_window_finds_the_known_capacity_and_a_slower_policy_pairs_below() -> None:
    """Two replicas, B = 4, a 10 ms step, outputs of 10 tokens: a slot turns over every
    0.1 s, so JSQ carries 2 x 40 = 80 req/s and SkipLast (never the last replica) 40.
    Every window finds its own capacity, and the paired ratio is -50% in each."""
    kw: dict[str, Any] = dict(replicas=2, slots=4, step_a_s_per_token=0.0, step_b_s=0.01,
              prefill_p0_s=0.0, prefill_p1_s_per_token=0.0)
    specs = [RunSpec(parse_sim_config(policy="jsq", **kw)),
             RunSpec(parse_sim_config(policy=SKIP, **kw), label="skip-last")]
    res = paired_capacity(_flat(400), specs, SLO(tpot_p95_ms=100, ttft_p95_s=0.05),
                          replays=3, replay_mode="seed", jobs=1,
                          bracket=Bracket(lo_req_s=5, hi_req_s=400, rel_tol=0.01))
    jsq, skip = res.row("jsq"), res.row("skip-last")
    assert res.meta["search"] == "per_replay" and res.meta["replays"] == 3
    assert len(jsq["per_replay"]) == len(skip["per_replay"]) == 3
    for w in jsq["per_replay"]:
        assert w["met"] and w["capacity_req_s"] == pytest.approx(80.0, rel=0.02)
    for w in skip["per_replay"]:
        assert w["capacity_req_s"] == pytest.approx(40.0, rel=0.02)
    assert jsq["capacity_vs_baseline"] == 0.0
    assert skip["capacity_vs_baseline"] == pytest.approx(-0.5, abs=0.02)
    lo, hi = skip["capacity_vs_baseline_ci95"]
    assert lo <= skip["capacity_vs_baseline"] <= hi and hi < 0
    assert skip["capacity_vs_baseline_n"] == 3


def test_compare_pairs_windows_and_leaves_out_a_window_the_baseline_could_not_serve() -> None:
    def run(*caps: float) -> dict[str, object]:
        return {"per_replay": [{"capacity_req_s": c} for c in caps]}

    out = compare(run(2.2, 3.3, 9.0), run(2.0, 3.0, 0.0))
    assert out["capacity_vs_baseline_n"] == 2
    assert out["capacity_vs_baseline"] == pytest.approx(0.1)
    assert out["capacity_vs_baseline_ci95"] == pytest.approx((0.1, 0.1))
    assert compare(run(1.0), run(0.0)) == {"capacity_vs_baseline": None,
                                            "capacity_vs_baseline_ci95": None,
                                            "capacity_vs_baseline_n": 0}
