"""bench-peers' pure parts: windows, client metrics, pairing, tables, agreement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from br_serve.bench import peers_report
from br_serve.bench.peers import Window, client_metrics, windows
from br_serve.bench.peers_routers import ARMS, router_command
from br_serve.bench.serve_bench import _Req


def _run(arm: str, w: int, thr: float, busy: float, protocol: str = "sglang"
         ) -> dict[str, Any]:
    return {"arm": arm, "protocol": protocol, "mode": "saturated", "rate_scale": 1.0,
            "window": w, "measured": {"output_tok_s": thr, "tpot_p50_ms": 50.0,
                                      "tpot_p95_ms": 60.0, "ttft_p50_ms": 1000.0,
                                      "ttft_p95_ms": 2000.0, "requests_lost": 0,
                                      "bad_tokens": 0,
                                      "engine": {"tokens_per_busy_s": busy,
                                                 "mean_imbalance_tokens": 10.0,
                                                 "barrier_idle_share": 0.1}}}


def test_pairing_best_router_and_agreement() -> None:
    rows = []
    for w, (rr, p2, gr) in enumerate([(100, 110, 121), (200, 220, 242), (150, 165, 180)]):
        rows += [_run("smg:round_robin", w, rr, rr), _run("smg:power_of_two", w, p2, p2),
                 _run("graph:br0", w, gr, gr)]
    summary = peers_report.summarise(rows)
    by = {r["arm"]: r for r in summary}
    assert by["smg:power_of_two"]["gain_vs_round_robin"]["mean"] == pytest.approx(0.10)
    assert by["graph:br0"]["best_router"] == "smg:power_of_two"
    g = by["graph:br0"]["gain_vs_best_router"]
    assert g["n"] == 3 and g["ci95"][0] < g["mean"] < g["ci95"][1]
    assert g["mean"] == pytest.approx((0.1 + 0.1 + 180 / 165 - 1) / 3)
    sims = {"smg:round_robin": {"policy": "round_robin", "throughput_tok_s": [1, 2, 3]},
            "smg:power_of_two": {"policy": "smg_power_of_two",
                                 "throughput_tok_s": [1.1, 2.2, 3.3]}}
    agree = {a["arm"]: a for a in peers_report.agreement(summary, sims,
                                                          {"sglang": "smg:round_robin"})}
    # measured +10% with zero spread: the interval is a point; +10% simulated lies in it
    assert agree["smg:power_of_two"]["simulated"] == pytest.approx(0.10)
    skipped = peers_report.agreement(summary, {**sims, "smg:power_of_two": {
        "policy": "x", "skipped": "not registered"}}, {"sglang": "smg:round_robin"})
    assert [a["note"] for a in skipped if a["arm"] == "smg:power_of_two"] == [
        "not registered"]
    md = peers_report.markdown({"summary": summary, "agreement": list(agree.values())})
    assert "| graph:br0 | 181.0 |" in md and "smg_power_of_two" in md
    # the graph's own model is checked like a rule: measured +20.7% at the engine
    graph_sim = {**sims, "graph:br0": {"policy": "br0", "throughput_tok_s": [1.21, 2.42, 3.6]}}
    rows_g = {a["arm"]: a for a in peers_report.agreement(summary, graph_sim,
                                                           {"sglang": "smg:round_robin"})}
    assert rows_g["graph:br0"]["simulated"] == pytest.approx((0.21 + 0.21 + 0.2) / 3)
    assert rows_g["graph:br0"]["agrees"] is True
    off = {**graph_sim, "graph:br0": {"policy": "br0", "throughput_tok_s": [1.0, 2.0, 3.0]}}
    assert [a["agrees"] for a in peers_report.agreement(
        summary, off, {"sglang": "smg:round_robin"}) if a["arm"] == "graph:br0"] == [False]


def test_client_metrics_counts_lost_and_timing() -> None:
    ok = _Req(0, 0.0, 4, 5, 1, status=200, sent_s=0.0, first_s=1.0, second_s=1.1,
              last_s=1.4, tokens=5)
    lost = _Req(1, 0.0, 4, 5, 2, status=500, error="boom", sent_s=0.5)
    m = client_metrics([ok, lost])
    assert m["requests_lost"] == 1 and m["output_tokens"] == 5
    assert m["output_tok_s"] == pytest.approx(5 / 1.4)
    assert m["tpot_p50_ms"] == pytest.approx(100.0) and m["ttft_p50_ms"] == 1000.0


def test_windows_are_the_simulators_windows(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n"
                    + "".join(f"{i * 0.5},{10 + i},{100 + i}\n" for i in range(40)))
    ws = windows(str(path), 4, 8, max_prompt=30, max_output=120, seed=0)
    assert len(ws) == 4 and len({w.start for w in ws}) == 4
    w = ws[-1]
    assert w.arrival_s[0] == 0.0 and max(w.prompt_tokens) <= 30
    assert max(w.output_tokens) <= 120 and w.rate_req_s == pytest.approx(2.0)
    reqs = Window(0, 3, (0.0, 2.0), (5, 6), (7, 8)).requests(False, rate_scale=2.0)
    assert [r.arrival_s for r in reqs] == [0.0, 1.0] and reqs[1].max_tokens == 9
    assert [r.arrival_s for r in Window(0, 3, (0.0, 2.0), (5, 6), (7, 8)).requests(True)
            ] == [0.0, 0.0]


def test_router_command_lines() -> None:
    smg = router_command(ARMS["smg:min_tokens"], 9, "http://127.0.0.1:1", "http://x:2", 4)
    # the DP-rank rule reads the decode URL's polled loads: no --dp-aware (the arm's own)
    assert smg[2:4] == ["smg", "launch"] and "--dp-aware" not in smg
    assert "--dp-aware" in router_command(ARMS["smg:min_tokens"], 9, "http://127.0.0.1:1",
                                          "http://x:2", 4, dp_aware=True)
    assert "--dp-aware" in router_command(ARMS["smg:least_load"], 9, "http://127.0.0.1:1",
                                          "http://x:2", 4)
    assert smg[smg.index("--prefill") + 2] == "1"  # the bootstrap port
    assert "--dp-minimum-tokens-scheduler" in smg and "127.0.0.1" in smg
    v = router_command(ARMS["vllm-router:consistent_hash"], 9, "http://p:1", "http://d:2", 8)
    assert v[v.index("--intra-node-data-parallel-size") + 1] == "8"
    assert v[-2:] == ["--policy", "consistent_hash"] and "--vllm-pd-disaggregation" in v
    # Arm.flags (what a run records) is what router_command starts, --dp-aware included
    for arm in ARMS.values():
        cmd = router_command(arm, 9, "http://127.0.0.1:1", "http://x:2", 4)
        assert set(arm.flags) <= set(cmd)
        assert ("--dp-aware" in arm.flags) == ("--dp-aware" in cmd) == bool(arm.starts_dp_aware)
    assert ARMS["vllm-router:round_robin"].starts_dp_aware is None


def test_reused_runs_must_come_from_the_same_windows(tmp_path: Any) -> None:
    import json

    import pytest

    from br_serve.bench.peers_cli import _measured

    cfg = {"trace": "t.csv", "windows": 2, "window": 8, "max_output": 128,
           "max_prompt": 99, "window_starts": [0, 10], "graph": {}}
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"config": cfg, "runs": [{"arm": "a"}], "capacity": None}))
    rows, cap, config = _measured(str(f), cfg)
    assert rows == [{"arm": "a"}] and cap is None and config["sim_graph"] == {}
    with pytest.raises(ValueError, match="windows starting"):
        _measured(str(f), {**cfg, "window_starts": [0, 11]})
    with pytest.raises(ValueError, match="max_output"):
        _measured(str(f), {**cfg, "max_output": 64})
