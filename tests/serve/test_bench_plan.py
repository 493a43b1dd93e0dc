"""bench-serve's run planning (named variants of one policy, per-entry options), the
heterogeneous cluster (``--slow``), gains over any baseline and the fitted-coefficient
table (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from br_serve.bench.serve_bench import plan_runs, slowed
from br_serve.bench.serve_report import format_step_fits, gains
from br_serve.cli import main
from br_serve.config.plan import plan_policy_runs
from br_serve.config.tree import leaves
from br_serve.core.options import ConfigError
from br_serve.serve.config import GraphConfig, parse_graph_config
from tests.serve.test_cli import _run, _sim


def test_a_named_variant_runs_one_policy_with_its_own_options() -> None:
    runs = plan_policy_runs(["jsq", "br0", "br0-time=br0"],
                            {"br0-time.cost": "time", "s_greedy": "2"})
    assert [r.label for r in runs] == ["jsq", "br0", "br0-time"]
    assert [r.policy for r in runs] == ["jsq", "br0", "br0"]
    # KEY reaches every entry whose policy has it; LABEL.KEY only that entry
    assert runs[1].options == {"s_greedy": "2"}
    assert runs[2].options == {"s_greedy": "2", "cost": "time"}
    # a policy name scopes the plain entry only, not its variants
    runs = plan_policy_runs(["br0", "fixed=br0"], {"br0.cost": "time"})
    assert runs[0].options == {"cost": "time"} and runs[1].options == {}


@pytest.mark.parametrize(("entries", "options", "match"), [
    (["br0", "br0=jsq"], {}, "listed twice"),
    (["t=br0", "t=jsq"], {}, "listed twice"),
    (["x.y=br0"], {}, "label"),
    (["v=nope"], {}, "nope"),
    (["v=br0"], {"br0.cost": "time"}, "br0.cost"),  # no plain br0 entry to scope
    (["jsq", "v=br0"], {"v.nonsense": "1"}, "v.nonsense"),
])
def test_bad_plans_are_refused_by_name(entries: list[str], options: dict[str, str],
                                       match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_policy_runs(entries, options)


def test_plan_runs_validates_each_runs_graph_config() -> None:
    base = parse_graph_config(replicas=4)
    planned = plan_runs(base, ["br0", "br0-time=br0"], {"br0-time.cost": "time"})
    (r0, c0), (r1, c1) = planned
    assert (r0.label, c0.serve.app_name, c0.policy.options) == ("br0", "bench_br0", {})
    assert (r1.label, c1.serve.app_name) == ("br0-time", "bench_br0-time")
    assert c1.policy.name == "br0" and c1.policy.options == {"cost": "time"}
    assert not c0.policy.needs().calibrated_step_costs
    assert c1.policy.needs().calibrated_step_costs  # its scheduler calibrates online


def test_slowed_engines_run_slower_than_the_configured_model() -> None:
    base = parse_graph_config(replicas=4, step_c_s_per_request=1e-3)
    cfg = slowed(slowed(base, [2, 3], 1.5), [3], 2.0)
    assert cfg.engine.step_factor == (1.0, 1.0, 1.5, 3.0)
    assert cfg.router_step_model() == base.router_step_model()  # what the scheduler is told
    m = cfg.emulated_step_model()  # what the engines run
    assert m.a_s_per_token == pytest.approx((5e-7, 5e-7, 7.5e-7, 1.5e-6))
    assert m.b_s == pytest.approx((0.03, 0.03, 0.045, 0.09))
    assert m.c_s_per_request == pytest.approx((1e-3, 1e-3, 1.5e-3, 3e-3))
    assert cfg.engine_timing(2).step.b_s == pytest.approx(0.045)  # what replica 2 emulates
    with pytest.raises(ValueError, match="--slow"):
        slowed(base, [4], 1.5)


@pytest.mark.parametrize(("factor", "match"), [
    ("1,2", "^engine.step_factor: 2 values for 4"), ("0", "^engine.step_factor"),
    ("1,1,-1,1", "^engine.step_factor")])
def test_bad_emulated_factor_is_named(factor: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_graph_config(replicas=4, engine_step_factor=factor)


def test_the_simulator_runs_the_hidden_slowdown_as_the_engines_do() -> None:
    """A slowdown the configured model does not know (a drift from step 0 in the
    simulator) prices every step as configuring it would, host overhead unslowed: jsq
        ignores coefficients, so its two runs agree (to 1%: the simulator's idle step
    while only delayed admissions wait is priced with the unperturbed ``b``, 0.2% here;
    slowing the overhead too would be 5% off)."""
    from br_serve.bench.serve_bench import load_workload
    from br_serve.bench.serve_report import simulate_one

    tr = load_workload(None, 40, 1.0, max_output=20, max_prompt=2000, seed=1)
    base = parse_graph_config(replicas=4, slots=4, policy="jsq", engine_slowdown=2)
    hidden = simulate_one(tr, slowed(base, [2, 3], 1.5), 0.01, 1)
    told = simulate_one(tr, parse_graph_config(
        base, step_a_s_per_token="5e-7,5e-7,7.5e-7,7.5e-7",
        step_b_s="0.03,0.03,0.045,0.045"), 0.01, 1)
    plain = simulate_one(tr, base, 0.01, 1)
    assert hidden["throughput_tok_s"] == pytest.approx(told["throughput_tok_s"], rel=0.01)
    assert hidden["throughput_tok_s"] < 0.9 * plain["throughput_tok_s"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--set", "policy=br0"], "--set policy"),
    (["--set", "policy_options={}"], "--set policy_options"),
    (["--set", "policy.options.r_max=2"], "--set policy.options.r_max"),
    (["--set", "predictor=survival"], "--set predictor"),
    (["--policies", "br0,t=br0", "--baseline", "jsq"], "--baseline"),
    (["--slow", "8:1.5"], "--slow"),
    (["--slow", "4-7"], "--slow"),
    (["--policies", "br0", "--policy-option", "cost=fast", "--baseline", "br0"], "cost"),
])
def test_bench_serve_refuses_bad_runs_before_starting_ray(
        argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-serve", "--requests", "5", *argv]) == 2
    assert match in capsys.readouterr().err


def test_gains_over_any_baseline_label() -> None:
    runs = [_run("br0", 0, 100.0, 100.0), _run("br0-time", 0, 112.0, 110.0)]
    sims = {"br0": _sim(1.0, [100.0]), "br0-time": _sim(1.0, [110.0])}
    g = gains(runs, sims, {}, baseline="br0")
    assert set(g) == {"br0-time_over_br0"}
    assert g["br0-time_over_br0"]["measured_wall"]["mean"] == pytest.approx(12.0)
    assert g["br0-time_over_br0"]["wall_difference_pp"] == pytest.approx(2.0)


def _fit(a: float, b: float, c: float) -> dict[str, float]:
    return {"a_s_per_token": a, "b_s": b, "c_s_per_request": c, "residual_scale_s": 1e-3,
            "steps": 300, "calibrated": True}


def test_the_fit_is_printed_beside_the_truth() -> None:
    cfg = slowed(parse_graph_config(replicas=2, engine_slowdown=2), [1], 1.5).model_dump()
    run: Any = _run("br0-time", 0, 1.0, 1.0)
    run["measured"].update(step_fit=[_fit(1.1e-6, 0.062, 0.0), _fit(1.5e-6, 0.091, 0.0)],
                           mean_replica_load_tokens=10_000.0, mean_replica_running=4.0)
    lines = format_step_fits({"config": cfg, "runs": [_run("br0", 0, 1.0, 1.0), run]})
    text = "\n".join(lines)
    assert "Step coefficients of br0-time" in text and "of br0 " not in text
    assert "10,000 tokens, 4.0 requests" in text
    # replica 1: true a = 5e-7 * 1.5 * 2, b = 0.03 * 1.5 * 2; step 105 ms true, 106 fit
    assert "| 1 | 1.5e-06 / 1.5e-06 | 0.0900 / 0.0910 | 0 / 0 | 105.0 / 106.0 |" in text


def test_results_written_before_the_sections_are_read() -> None:
    """``--resimulate`` and the fit table read result files whose ``config`` holds the
    old flat names (``time_scale``, ``emulated_step_factor``, ``app_name``, ...)."""
    from br_serve.serve.config import RENAMED, from_stored

    old = {"replicas": 2, "time_scale": 2.0, "emulated_step_factor": [1.0, 1.5],
           "app_name": "x", "port": 8123, "api_key": None, "mooncake_master": None,
           "policy": "br0", "policy_options": {}, "step_b_s": 0.02, "pool_capacity": 64}
    cfg = from_stored(old)
    assert (cfg.engine.slowdown, cfg.engine.step_factor) == (2.0, (1.0, 1.5))
    assert (cfg.serve.app_name, cfg.serve.port, cfg.pool.capacity) == ("x", 8123, 64)
    assert from_stored(cfg.model_dump()) == cfg
    assert set(RENAMED.values()) <= {leaf.name for leaf in leaves(GraphConfig)}


def test_resimulate_simulates_each_variant_with_its_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "old.json", tmp_path / "new.json"
    workload = {"trace": None, "requests": 30, "arrival_scale": 1.0, "max_output": 20,
                "max_prompt": 4000, "seed": 0}
    runs = [_run("br0", 0, 100.0, 120.0),
            {**_run("br0-time", 0, 104.0, 120.0), "policy_name": "br0",
             "policy_options": {"cost": "time"}}]
    cfg = slowed(parse_graph_config(replicas=4, slots=4), [2, 3], 1.5).model_dump()
    src.write_text(json.dumps({"config": cfg, "workload": workload, "requests": 30,
                               "repeats": 1, "baseline": "br0", "runs": runs}))
    assert main(["bench-serve", "--resimulate", str(src), "--out", str(out),
                 "--sim-seeds", "2"]) == 0
    res = json.loads(out.read_text())
    assert res["baseline"] == "br0" and set(res["gains"]) == {"br0-time_over_br0"}
    assert set(res["host_overhead_s"]) == {"br0", "br0-time"}
    assert set(res["simulated"]) == {"br0", "br0-time"}
    assert "br0-time_over_br0" in capsys.readouterr().out


def test_the_simulator_cli_refuses_variants_it_cannot_label(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n')
    assert main(["sim", "--trace", str(trace), "--policies", "br0,t=br0",
                 "--out", str(tmp_path / "o")]) == 2
    assert "named variants" in capsys.readouterr().err
