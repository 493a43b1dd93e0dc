"""docs/results.md's renderer on a tiny synthetic document: claims follow the intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from br_serve.bench.results_render import render
from br_serve.sim import parse_sim_config
from br_serve.sim.capacity import SLO, Bracket, capacity
from br_serve.sim.ensemble import run_ensemble
from br_serve.sim.ensemble_output import deferral
from br_serve.sim.runner import RunSpec
from br_serve.sim.stationary import Stationary
from br_serve.traces import Trace


def test_render_states_intervals_and_ties(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    n = 400
    tr = Trace.build(np.cumsum(rng.exponential(0.3, n)), rng.integers(10, 4000, n),
                     rng.integers(1, 80, n), source="synthetic")
    mk = [("jsq", None), ("round_robin", None), ("br0", None), ("brh", "oracle")]
    sat = [RunSpec(parse_sim_config(policy=p, predictor=pr, replicas=2, slots=4,
                                    sim_saturated=True))
           for p, pr in mk]
    timed = [RunSpec(parse_sim_config(policy=p, predictor=pr, replicas=2, slots=4)) for p, pr in mk]
    st = run_ensemble(tr, sat, replays=3, limit=150, stationary=Stationary(), jobs=1)
    tt = run_ensemble(tr, timed, replays=3, limit=120, jobs=1)
    cap = capacity(tr, timed[:2], SLO(tpot_p95_ms=60, ttft_p95_s=5), replays=2,
                   replay_mode="window", limit=120, jobs=1,
                   bracket=Bracket(lo_req_s=0.5, hi_req_s=20, rel_tol=0.1))
    cells: dict[str, Any] = {
        "stationary-G8": st.to_dict() | {"wall_s": 1.0, "window_requests": 150},
        "trace-80": tt.to_dict() | {"wall_s": 1.0, "window_requests": 120,
                                    "rate_scale": 1.0, "load": 0.8},
        "capacity": cap.to_dict() | {"wall_s": 1.0, "window_requests": 120}}
    doc = {"config": {"replays": 3, "jobs": 1, "only": None, "capacity_tol": 0.1,
                      "capacity_requests": 120, "slots": 4, "seed": 0},
           "commit": "abc", "wall_s": 60.0, "policies": ["jsq", "round_robin", "br0",
                                                         "brh+oracle"],
           "slo": {"tpot_factor": 1.25, "ttft_p95_s": 5.0},
           "step": {"a_s_per_token": 5e-7, "b_s": 0.03},
           "workloads": {"synthetic": {"info": {
               "requests": n, "hash_ids": False, "input_mean": 1.0, "input_p50": 1.0,
               "output_mean": 1.0, "output_p50": 1.0, "offered_req_s": 1.0},
               "cells": cells}}}
    md = render(doc, tmp_path / "plots", tmp_path)
    assert "K = 3" in md and "Student t-interval" in md
    assert (tmp_path / "plots" / "synthetic_gain.png").exists()
    assert (tmp_path / "plots" / "synthetic_capacity.png").exists()
    # every policy of the stationary cell is classified by its interval, or listed as
    # not stationary (its admissions unrepresentative), none left out
    row = {r["label"]: r for r in st.ensemble}
    lines = md.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("- **synthetic, stationary"))
    line = lines[at]
    for lab in ("round_robin", "br0", "brh+oracle"):
        r = row[lab]
        if deferral(r):
            assert lab not in line and lab in lines[at + 1]
            assert lines[at + 1].lstrip().startswith("Not stationary")
            continue
        assert lab in line
        lo, hi = r["gain_vs_baseline_ci95"]
        where = line.split(lab)[0]
        if lo > 0:
            assert where.rfind("above jsq") > where.rfind("ties with jsq")
        elif hi < 0:
            assert "below jsq" in where
        else:
            assert where.rfind("ties with jsq") > where.rfind("above jsq")
    assert "capacity at the SLO" in md and "req/s" in md
