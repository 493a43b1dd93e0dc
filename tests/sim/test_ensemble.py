"""Paired ensembles, the stationary mode and the capacity search, on answers known by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from br_serve.sim import parse_sim_config
from br_serve.sim.capacity import SLO, Bracket, capacity
from br_serve.sim.ensemble import run_ensemble
from br_serve.sim.runner import WALL_CLOCK_KEYS, RunSpec
from br_serve.sim.stationary import Stationary
from br_serve.traces import Trace


def _trace(n: int = 300, seed: int = 3) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.build(np.cumsum(rng.exponential(0.05, n)), rng.integers(10, 3000, n),
                       rng.integers(1, 120, n), source="unit")


def _flat(n: int, out: int = 10, prompt: int | np.ndarray = 100,
          gap_s: float = 1.0) -> Trace:
    p = np.broadcast_to(np.asarray(prompt), (n,))
    return Trace.build(gap_s * np.arange(n, dtype=float), p, np.full(n, out), source="flat")


def _no_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS
             and not k.startswith(("tick_p", "wall_s", "steps_per_s"))} for r in rows]


def test_same_policy_under_two_names_gains_exactly_zero() -> None:
    cfg = parse_sim_config(policy="random", replicas=3, slots=4, sim_saturated=True)
    specs = [RunSpec(cfg), RunSpec(cfg, label="random-again"),
             RunSpec(parse_sim_config(policy="jsq", replicas=3, slots=4, sim_saturated=True))]
    ens = run_ensemble(_trace(), specs, replays=5, limit=120, baseline="random", jobs=1)
    row = ens.row("random-again")
    assert row["gain_vs_baseline_mean"] == 0.0
    assert row["gain_vs_baseline_se"] == 0.0
    assert row["gain_vs_baseline_ci95"] == [0.0, 0.0]
    assert row["gain_vs_baseline_tie"] is True
    assert row["replays"] == 5 and row["baseline"] == "random"
    # the pairing is real: jsq differs from random in some replay
    gains = [r["gain_vs_baseline"] for r in ens.runs if r["label"] == "jsq"]
    assert len(gains) == 5 and any(g != 0 for g in gains)
    jsq = ens.row("jsq")
    assert jsq["gain_vs_baseline_mean"] == pytest.approx(float(np.mean(gains)))
    assert jsq["gain_vs_baseline_se"] == pytest.approx(float(np.std(gains, ddof=1) / 5 ** .5))
    lo, hi = jsq["gain_vs_baseline_ci95"]
    assert lo == pytest.approx(jsq["gain_vs_baseline_mean"] - 2.7764 * jsq["gain_vs_baseline_se"],
                               abs=1e-6)
    assert hi > lo
    assert jsq["gain_vs_baseline_tie"] == (lo <= 0 <= hi)


def test_ensemble_rows_and_runs_are_complete() -> None:
    specs = [RunSpec(parse_sim_config(policy=p, replicas=2, slots=3, sim_saturated=True))
             for p in ("jsq", "br0")]
    ens = run_ensemble(_trace(), specs, replays=3, limit=80, jobs=1)
    assert len(ens.runs) == 6
    assert [(r["label"], r["replay"]) for r in ens.runs] == [
        ("jsq", 0), ("br0", 0), ("jsq", 1), ("br0", 1), ("jsq", 2), ("br0", 2)]
    need = {"policy", "predictor", "replicas", "replays", "throughput_tok_s_mean",
            "throughput_tok_s_se", "mean_imbalance_tokens_mean", "headroom_share_mean",
            "gain_vs_baseline_mean", "gain_vs_baseline_se", "gain_vs_baseline_ci95",
            "baseline", "barrier_idle_share_mean", "mean_step_ms_mean",
            "tokens_per_busy_s_mean", "wait_beyond_fcfs_s_p99_mean"}
    for row in ens.ensemble:
        assert set(row) >= need
    br0 = ens.row("br0")
    thr = [r["throughput_tok_s"] for r in ens.runs if r["label"] == "br0"]
    assert br0["throughput_tok_s_mean"] == pytest.approx(float(np.mean(thr)))
    base = [r["throughput_tok_s"] for r in ens.runs if r["label"] == "jsq"]
    bound = [r["balanced_bound_tok_s"] for r in ens.runs if r["label"] == "br0"]
    share = sum(t - b for t, b in zip(thr, base, strict=True)) / sum(
        x - b for x, b in zip(bound, base, strict=True))
    assert br0["headroom_share_mean"] == pytest.approx(share)
    # replays are disjoint windows of 80 out of 300 (strata of 221 starts)
    starts = [r["start"] for r in ens.replays]
    assert len(set(starts)) == 3 and starts == sorted(starts)


def test_same_seed_same_ensemble_for_any_jobs() -> None:
    specs = [RunSpec(parse_sim_config(policy=p, predictor=pr, replicas=3, slots=4,
                                      sim_saturated=True))
             for p, pr in (("jsq", None), ("random", None), ("br0", None), ("brh", "oracle"))]
    a = run_ensemble(_trace(), specs, replays=3, limit=100, seed=11, jobs=1)
    b = run_ensemble(_trace(), specs, replays=3, limit=100, seed=11, jobs=2)
    c = run_ensemble(_trace(), specs, replays=3, limit=100, seed=12, jobs=2)
    assert _no_wall(a.runs) == _no_wall(b.runs)
    assert _no_wall(a.ensemble) == _no_wall(b.ensemble)
    assert a.replays == b.replays
    assert a.replays != c.replays


def test_bad_ensemble_input_names_the_field() -> None:
    specs = [RunSpec(parse_sim_config(policy="jsq", replicas=2, sim_saturated=True))]
    with pytest.raises(ValueError, match=r"^replays:"):
        run_ensemble(_trace(), specs, replays=0, limit=10, jobs=1)
    with pytest.raises(ValueError, match=r"^replay_mode:"):
        run_ensemble(_trace(), specs, replays=2, replay_mode="bootstrap", limit=10, jobs=1)
    with pytest.raises(ValueError, match=r"^limit:.*300 requests, fewer than one window of 400"):
        run_ensemble(_trace(), specs, replays=2, limit=400, jobs=1)
    with pytest.raises(ValueError, match=r"^baseline: 'p2c'"):
        run_ensemble(_trace(), specs, replays=2, limit=10, baseline="p2c", jobs=1)
    with pytest.raises(ValueError, match=r"^jobs:"):
        run_ensemble(_trace(), specs, replays=2, limit=10, jobs=0)
    dup = [specs[0], RunSpec(parse_sim_config(policy="br0", replicas=2, sim_saturated=True),
                             label="jsq")]
    with pytest.raises(ValueError, match=r"^policies: label"):
        run_ensemble(_trace(), dup, replays=2, limit=10, jobs=1)
    with pytest.raises(ValueError, match=r"^limit: 10 requests are too few"):
        run_ensemble(_trace(), specs, replays=2, limit=10, stationary=Stationary(), jobs=1)


def test_stationary_window_by_hand() -> None:
    """G = 1, B = 1, step 10 ms, every output 10 steps: one admission per 0.1 s. Pool depth
    4, warm-up 4 + 2 admissions. Row i is admitted at step 10 i and (i >= 4) entered the
    pool at step 10 (i - 4), so it waits 0.4 s; row 19, the last, enters at step 150."""
    cfg = parse_sim_config(policy="jsq", replicas=1, slots=1, step_a_s_per_token=0.0,
                    step_b_s=0.01)
    ens = run_ensemble(_flat(20), [RunSpec(cfg)], replays=1, replay_mode="none",
                       stationary=Stationary(), jobs=1)
    (run,) = ens.runs
    assert run["mode"] == "stationary" and ens.mode == "stationary"
    assert (run["pool_depth"], run["warmup_admissions"]) == (4, 6)
    assert (run["window_start_step"], run["window_end_step"]) == (60, 151)
    assert run["window_admitted"] == 10  # rows 6..15
    assert run["throughput_tok_s"] == pytest.approx(100.0)
    assert run["whole_run_throughput_tok_s"] == pytest.approx(100.0)  # drain included
    assert run["barrier_idle_share"] == 0.0
    assert run["mean_step_ms"] == pytest.approx(10.0)
    assert run["ttft_p50_ms"] == pytest.approx(410.0)  # 0.4 s in the pool + one step
    assert run["representative"] is True
    assert run["admitted_vs_offered_output"] == 1.0
    assert run["wait_beyond_fcfs_s_max"] == 0.0
    assert 0.3 < run["pool_age_s_max"] < 0.4 + 1e-9
    with pytest.raises(ValueError, match="pool_depth"):
        Stationary(pool_depth=0)


def test_capacity_of_a_trivial_cluster_within_two_percent() -> None:
    """One replica, B = 4, a step of 10 ms whatever the load, every output 10 tokens, no
    prefill time: a request holds a slot 0.1 s, so the cluster serves 4 / 0.1 = 40 req/s.
    Below that (evenly spaced arrivals) nobody queues and TTFT <= 2 steps; above it the
    queue grows over the 400 requests and TTFT P95 passes 50 ms."""
    cfg = parse_sim_config(policy="jsq", replicas=1, slots=4, step_a_s_per_token=0.0, step_b_s=0.01,
                    prefill_p0_s=0.0, prefill_p1_s_per_token=0.0)
    res = capacity(_flat(400), [RunSpec(cfg), RunSpec(cfg, label="jsq-again")],
                   SLO(tpot_p95_ms=100, ttft_p95_s=0.05), replays=2, replay_mode="seed",
                   jobs=1, bracket=Bracket(lo_req_s=5, hi_req_s=200, rel_tol=0.01))
    row = res.row("jsq")
    assert row["met"] and not row["capped"]
    assert row["capacity_req_s"] == pytest.approx(40.0, rel=0.02)
    assert row["tpot_p95_ms"] == pytest.approx(10.0)
    assert row["ttft_p95_s"] <= 0.05
    assert res.row("jsq-again")["capacity_vs_baseline"] == 0.0
    assert res.meta["base_req_s"] == pytest.approx(1.0)
    tried = [e["req_s"] for e in row["evaluations"]]
    assert all(e["meets"] == (e["req_s"] <= row["capacity_req_s"])
               for e in row["evaluations"]), tried


def test_capacity_unmeetable_and_capped_slos_say_so() -> None:
    cfg = parse_sim_config(policy="jsq", replicas=1, slots=4, step_a_s_per_token=0.0, step_b_s=0.01,
                    prefill_p0_s=0.0, prefill_p1_s_per_token=0.0)
    tr = _flat(200)
    res = capacity(tr, [RunSpec(cfg)], SLO(tpot_p95_ms=5, ttft_p95_s=10), replays=1,
                   replay_mode="seed", jobs=1)
    row = res.runs[0]
    assert row["capacity_req_s"] == 0.0 and row["met"] is False
    assert "no rate can meet the SLO" in row["note"] and "b = 10 ms" in row["note"]
    low = capacity(tr, [RunSpec(cfg)], SLO(tpot_p95_ms=100, ttft_p95_s=0.05), replays=1,
                   replay_mode="seed", jobs=1, bracket=Bracket(lo_req_s=60, hi_req_s=90))
    assert low.runs[0]["capacity_req_s"] == 0.0
    assert "low end 60 req/s" in low.runs[0]["note"]
    top = capacity(tr, [RunSpec(cfg)], SLO(tpot_p95_ms=100, ttft_p95_s=0.05), replays=1,
                   replay_mode="seed", jobs=1, bracket=Bracket(lo_req_s=2, hi_req_s=20))
    assert top.runs[0]["capped"] and top.runs[0]["capacity_req_s"] == 20
    with pytest.raises(ValueError, match=r"^sim.saturated:"):
        capacity(tr, [RunSpec(parse_sim_config(policy="jsq", sim_saturated=True))], SLO(50, 1))
    with pytest.raises(ValueError, match=r"^slo_tpot_p95_ms:"):
        SLO(0, 1)
    with pytest.raises(ValueError, match=r"^rate_lo_req_s:"):
        Bracket(lo_req_s=5, hi_req_s=4)
    with pytest.raises(ValueError, match=r"^rate_tol:"):
        Bracket(rel_tol=0)


SKIP = "tests.sim.known_policies.SkipLast"
SMALL = "tests.sim.known_policies.SmallestFirst"


@pytest.mark.parametrize("stationary", [None, Stationary()])
def test_a_fixed_fraction_slower_policy_gives_that_fraction(
        stationary: Stationary | None) -> None:
    """Step time 10 ms whatever the load (a = 0), every output 5 steps, saturated: JSQ
    keeps all G x B = 8 slots busy, SkipLast never uses the last of 4 replicas, so it
    produces 6 tokens per step against 8 in every replay: gain -25% exactly."""
    cfg: dict[str, Any] = dict(replicas=4, slots=2, sim_saturated=True, step_a_s_per_token=0.0,
                               step_b_s=0.01)
    specs = [RunSpec(parse_sim_config(policy="jsq", **cfg)),
             RunSpec(parse_sim_config(policy=SKIP, **cfg), label="skip-last")]
    ens = run_ensemble(_flat(400, out=5), specs, replays=3, limit=240,
                       stationary=stationary, jobs=1)
    row = ens.row("skip-last")
    assert row["gain_vs_baseline_mean"] == pytest.approx(-0.25, abs=1e-12)
    assert row["gain_vs_baseline_se"] == pytest.approx(0.0, abs=1e-12)
    assert row["throughput_tok_s_mean"] == pytest.approx(600.0)
    assert ens.row("jsq")["throughput_tok_s_mean"] == pytest.approx(800.0)


def test_deferral_gains_in_the_steady_window_but_not_when_stationary() -> None:
    """SmallestFirst admits short prompts first. Prompts alternate 10 / 20,000 tokens and
    a step costs 1 us per KV token: in the saturated steady window (every request in the
    pool at t = 0) it runs the short ones first and "gains"; in the stationary mode the
    pool fills with the long ones it deferred, which it must then admit: no gain, but
    they wait far beyond their FCFS turn and the pool's ages grow."""
    n = 600
    prompt = np.where(np.arange(n) % 2 == 0, 10, 20_000)
    out = np.random.default_rng(0).integers(5, 30, n)
    tr = Trace.build(np.arange(n, dtype=float), prompt, out, source="bimodal")
    cfg: dict[str, Any] = dict(replicas=2, slots=2, sim_saturated=True, step_a_s_per_token=1e-6,
                               step_b_s=0.01)
    specs = [RunSpec(parse_sim_config(policy="jsq", **cfg)),
             RunSpec(parse_sim_config(policy=SMALL, **cfg), label="smallest-first")]
    window = run_ensemble(tr, specs, replays=3, limit=300, jobs=1).row("smallest-first")
    assert window["gain_vs_baseline_ci95"][0] > 0.1  # a clear "win" of +26%
    st = run_ensemble(tr, specs, replays=3, limit=300, stationary=Stationary(), jobs=1)
    row, jsq = st.row("smallest-first"), st.row("jsq")
    assert row["gain_vs_baseline_tie"] and abs(row["gain_vs_baseline_mean"]) < 0.05
    assert jsq["wait_beyond_fcfs_ranks_p99_mean"] == 0.0
    assert row["wait_beyond_fcfs_ranks_p99_mean"] >= 10
    assert row["pool_age_s_p99_mean"] > 1.5 * jsq["pool_age_s_p99_mean"]
