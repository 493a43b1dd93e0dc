"""``bench-peers --capacity``: the per-window search and its pairing, Ray-free (a model
run function stands in for the live runs)."""

from __future__ import annotations

from typing import Any

import pytest

from br_serve.bench.peers import Plan, Window
from br_serve.bench.peers_capacity import capacity_per_window, default_slo, paired_ratio
from br_serve.bench.peers_report import markdown
from br_serve.bench.peers_routers import Arm
from br_serve.serve.config import parse_graph_config
from br_serve.sim.capacity import SLO

GRAPH = Arm("graph:br0", "graph", "br0", (), "br0")
RR = Arm("smg:round_robin", "smg", "round_robin", (), "router_round_robin")
P2 = Arm("smg:power_of_two", "smg", "power_of_two", (), None)


def _window(i: int, rate: float) -> Window:
    n = 8
    return Window(i, 100 * i, tuple(k / rate for k in range(n)), (1000,) * n, (100,) * n)


def _plan(windows: list[Window]) -> Plan:
    base = parse_graph_config({"replicas": "4", "slots": "4"})
    return Plan(base, (("sglang", GRAPH), ("sglang", RR), ("sglang", P2)), tuple(windows),
                True, (), 60.0)


def _decode(wins: list[Window], reqs: list[Any]) -> tuple[int, float]:
    """The window (from the requests' seeds: 10,000 + the window's start + row) and
    the rate multiplier (from the first gap) of one run."""
    w = (reqs[0].seed - 10_000) // 100
    return w, wins[w].arrival_s[1] / reqs[1].arrival_s


def test_each_window_is_searched_alone_and_compared_pairwise() -> None:
    wins = [_window(0, 2.0), _window(1, 4.0)]
    caps = {("graph:br0", 0): 1.5, ("graph:br0", 1): 0.8,
            ("smg:round_robin", 0): 1.0, ("smg:round_robin", 1): 0.8,
            ("smg:power_of_two", 0): 0.5, ("smg:power_of_two", 1): 0.4}
    calls: list[tuple[str, int, float]] = []

    def run(arm: Arm, protocol: str, base: Any, reqs: list[Any], timeout_s: float
            ) -> dict[str, Any]:
        w, s = _decode(wins, reqs)
        calls.append((arm.label, w, s))
        ok = s <= caps[(arm.label, w)]
        return {"tpot_p95_ms": 50.0 if ok else 500.0, "ttft_p95_ms": 1000.0,
                "requests_lost": 0, "output_tok_s": 10.0,
                "engine": {"barrier_idle_share": 0.2}}

    rows = capacity_per_window(_plan(wins), SLO(100.0, 10.0), 0.25, 4.0, 0.02, run=run,
                               progress=lambda _: None)
    by = {r["arm"]: r for r in rows}
    for (arm, w), cap in caps.items():
        got = by[arm]["per_window"][w]["capacity_scale"]
        assert cap / 1.02 <= got <= cap  # within the tolerance, never above
        assert by[arm]["per_window"][w]["capacity_req_s"] == pytest.approx(
            got * wins[w].rate_req_s)
        for e in by[arm]["per_window"][w]["evaluations"]:
            assert e["req_s"] == pytest.approx(e["scale"] * wins[w].rate_req_s)
    # the graph against the best router (round robin): +50% and 0% -> mean +25%
    vs = by["graph:br0"]["vs_best_router"]
    assert by["graph:br0"]["best_router"] == "smg:round_robin"
    assert vs["n"] == 2 and vs["mean"] == pytest.approx(0.25, abs=0.03)
    assert by["smg:power_of_two"]["vs_round_robin"]["mean"] == pytest.approx(-0.5, abs=0.03)
    assert "vs_round_robin" not in by["smg:round_robin"]
    # interleaved: each round visits window 0's arms, then window 1's
    first = [(a, w) for a, w, _ in calls[:6]]
    assert first == [("graph:br0", 0), ("smg:round_robin", 0), ("smg:power_of_two", 0),
                     ("graph:br0", 1), ("smg:round_robin", 1), ("smg:power_of_two", 1)]
    md = markdown({"runs": [], "summary": [], "capacity": rows,
                   "slo": {"tpot_p95_ms": 100.0, "ttft_p95_s": 10.0}})
    assert "capacity at the SLO (TPOT P95 <= 100.0 ms" in md
    assert f"| {100 * vs['mean']:+.1f}% [" in md


def test_a_failed_or_lossy_run_misses_the_slo_at_that_rate() -> None:
    wins = [_window(0, 2.0)]

    def run(arm: Arm, protocol: str, base: Any, reqs: list[Any], timeout_s: float
            ) -> dict[str, Any]:
        _, s = _decode(wins, reqs)
        if arm.label == "smg:power_of_two":
            raise RuntimeError("router exited")
        lost = 1 if arm.label == "graph:br0" and s > 1.0 else 0
        return {"tpot_p95_ms": 50.0, "ttft_p95_ms": 1000.0, "requests_lost": lost,
                "output_tok_s": 10.0, "engine": {"barrier_idle_share": 0.2}}

    rows = capacity_per_window(_plan(wins), SLO(100.0, 10.0), 0.25, 4.0, 0.02, run=run,
                               progress=lambda _: None)
    by = {r["arm"]: r for r in rows}
    g = by["graph:br0"]["per_window"][0]
    assert 1.0 / 1.02 <= g["capacity_scale"] <= 1.0  # loss above x1 is a miss
    assert any(e.get("failed") == "1 request(s) lost" for e in g["evaluations"])
    rr = by["smg:round_robin"]["per_window"][0]
    assert rr["capped"] and rr["capacity_scale"] == 4.0
    p2 = by["smg:power_of_two"]
    assert p2["windows_met"] == 0 and p2["capacity_req_s"] == 0.0
    assert p2["per_window"][0]["evaluations"][0]["failed"].startswith("RuntimeError")
    # no ratio over a baseline without capacity
    assert paired_ratio(by["graph:br0"], p2) is None


def test_the_default_tpot_bound_is_the_projects_rule() -> None:
    base = parse_graph_config({"replicas": "4", "slots": "4", "engine.slowdown": "2"})
    wins = [_window(0, 2.0)]
    slo = default_slo(base, wins, None, 10.0)
    a, b, _ = base.emulated_step_model(scaled=True).arrays(4)
    step = float(b.mean()) + float(a.mean()) * 4 * (1000 + 100 / 2)
    assert slo.tpot_p95_ms == pytest.approx(1.25 * step * 1e3)
    assert default_slo(base, wins, 80.0, 5.0) == SLO(80.0, 5.0)
    with pytest.raises(ValueError, match="slo_tpot_p95_ms"):
        default_slo(base, wins, 0.0, 5.0)


def test_a_bad_bracket_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="bracket"):
        capacity_per_window(_plan([_window(0, 2.0)]), SLO(100.0, 10.0), 2.0, 1.0, 0.05,
                            run=lambda *a: {}, progress=lambda _: None)
