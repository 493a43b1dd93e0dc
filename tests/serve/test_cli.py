"""``br-serve demo`` / ``bench-serve`` / ``serve``: argument errors and bench helpers (no Ray),
plus the bounded demo end to end (its own local Ray; slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from br_serve.bench.serve_bench import load_workload
from br_serve.bench.serve_report import format_table, gains, host_overhead_s, jittered
from br_serve.cli import main


@pytest.mark.parametrize("argv", [
    ["demo", "--set", "replicas=0"],
    ["demo", "--set", "policy=nope"],
    ["bench-serve", "--set", "slots"],
    ["bench-serve", "--policies", "jsq,bogus", "--requests", "3"],
    ["serve", "--set", "transport=pigeon"],
])
def test_bad_arguments_exit_2_naming_the_field(argv: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"br-serve {argv[0]}: error: ")
    assert any(w in err for w in ("replicas:", "policy.name:", "--set:", "transport.name:",
                                  "--policies:", "policy:"))


def test_missing_trace_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-serve", "--trace", "/nonexistent/t.jsonl"]) == 2
    assert "/nonexistent/t.jsonl" in capsys.readouterr().err


def test_a_port_is_picked_only_where_none_was_given_and_keeps_the_rest() -> None:
    """The launchers pick the Serve port after Ray started (on_free_port): Ray's own
    processes bind ephemeral ports as they start and once took one picked before them.
    A port the user gave is kept; the picked one is free and nothing else changes."""
    import socket

    from br_serve.serve.cli import on_free_port, port_given
    from br_serve.serve.config import parse_graph_config

    assert port_given({"serve.port": "9000"}) and port_given({"serve_port": "9000"})
    assert not port_given({"replicas": "4", "serve.host": "127.0.0.1"})
    base = parse_graph_config({"replicas": "3", "slots": "5"})
    moved = on_free_port(base)
    assert moved.model_dump(exclude={"serve"}) == base.model_dump(exclude={"serve"})
    assert moved.serve.host == base.serve.host
    with socket.socket() as s:  # free: it binds
        s.bind(("127.0.0.1", moved.serve.port))


def test_workload_clips_and_scales() -> None:
    tr = load_workload(None, 50, 0.5, max_output=7, max_prompt=100, seed=3)
    assert len(tr) == 50
    assert tr.output_tokens.max() <= 7 and tr.input_tokens.max() <= 100
    ref = load_workload(None, 50, 1.0, max_output=7, max_prompt=100, seed=3)
    assert np.allclose(tr.arrival_s, ref.arrival_s * 0.5)


def _run(pol: str, rep: int, thr: float, model_thr: float) -> dict[str, object]:
    meas = {"throughput_tok_s": thr, "model_throughput_tok_s": model_thr,
            "tpot_p95_ms": 80.0, "mean_imbalance_tokens": 1000.0, "requests_lost": 0,
            "bad_tokens": 0, "tick_dispatch_share_of_step": 0.01, "busy_s": 12.0,
            "model_busy_s": 10.0, "busy_steps": 100}
    return {"policy": pol, "repeat": rep, "measured": meas}


def _sim(point: float, ens: list[float], model: list[float] | None = None
         ) -> dict[str, object]:
    return {"point": {"throughput_tok_s": point}, "throughput_tok_s": ens,
            "model_throughput_tok_s": model or ens,
            "mean_imbalance_tokens": [900.0] * len(ens), "tpot_p95_ms": [70.0] * len(ens)}


def test_gains_pair_repeats_and_seeds() -> None:
    runs = [_run("jsq", 0, 100.0, 200.0), _run("br0", 0, 110.0, 230.0),
            _run("jsq", 1, 100.0, 100.0), _run("br0", 1, 130.0, 105.0)]
    sims = {"jsq": _sim(1.0, [100.0, 100.0], [100.0, 200.0]),
            "br0": _sim(1.0, [119.0, 121.0], [110.0, 240.0])}
    paper = {"jsq": _sim(400.0, [100.0, 200.0]), "br0": _sim(440.0, [110.0, 240.0])}
    g = gains(runs, sims, paper)["br0_over_jsq"]
    # paired within a repeat: (+10%, +30%) wall, (+15%, +5%) model-priced
    assert g["measured_wall"]["values"] == pytest.approx([10.0, 30.0])
    assert g["measured_wall"]["mean"] == pytest.approx(20.0)
    assert g["measured_wall"]["se"] == pytest.approx(10.0)
    assert g["measured_model"]["mean"] == pytest.approx(10.0)
    # paired within a seed: wall (+19%, +21%), model (+10%, +20%)
    assert g["sim_wall"]["mean"] == pytest.approx(20.0)
    assert g["sim_model"]["mean"] == pytest.approx(15.0)
    assert g["wall_difference_pp"] == pytest.approx(0.0)
    assert g["model_difference_pp"] == pytest.approx(-5.0)
    assert g["paper"]["mean"] == pytest.approx(15.0)
    assert g["paper_point_pct"] == pytest.approx(10.0)
    # the goal is on the measured (wall-clock) gain; model-priced is a diagnostic
    assert g["within_goal"] is True
    runs_off = [*runs[:3], _run("br0", 1, 150.0, 105.0)]  # wall (+10%, +50%): +30%
    assert gains(runs_off, sims, paper)["br0_over_jsq"]["within_goal"] is False
    # calibrated on the baseline's runs only: (12 - 10) s over 100 steps, per jsq run
    assert host_overhead_s(runs, "jsq") == pytest.approx(0.02)
    result = {"runs": runs, "simulated": sims, "gains": {"br0_over_jsq": g},
              "sim_seeds": 2, "sim_jitter_s": 0.05, "host_overhead_s": {"jsq": 0.02},
              "admit_delay_steps": 1, "overhead_from": "jsq"}
    text = format_table(result)
    assert "| br0 | 2 | 120.0 / 120.0 | 167.5 / 175.0 |" in text
    assert "of the simulator's: yes" in text and "jsq 20.0" in text
    assert gains([_run("br0", 0, 1.0, 1.0)], {}, {}) == {}


def test_resimulate_redoes_the_simulator_side(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "old.json", tmp_path / "new.json"
    workload = {"trace": None, "requests": 30, "arrival_scale": 1.0, "max_output": 20,
                "max_prompt": 4000, "seed": 0}
    runs = [_run(p, r, 100.0 + r, 120.0) for r in (0, 1) for p in ("jsq", "br0")]
    src.write_text(json.dumps({"config": {"replicas": 4, "slots": 4}, "workload": workload,
                               "requests": 30, "repeats": 2, "runs": runs}))
    assert main(["bench-serve", "--resimulate", str(src), "--out", str(out),
                 "--sim-seeds", "2"]) == 0
    res = json.loads(out.read_text())
    assert res["runs"] == runs
    assert res["host_overhead_s"] == {"jsq": pytest.approx(0.02), "br0": pytest.approx(0.02)}
    sim = res["simulated"]["br0"]
    assert len(sim["throughput_tok_s"]) == 2 and sim["point"]["steps"] > 0
    # the calibrated run's model-priced throughput removes the overhead again
    assert all(m > w for m, w in zip(sim["model_throughput_tok_s"], sim["throughput_tok_s"],
                                     strict=True))
    assert "br0_over_jsq" in res["gains"] and "| br0 | 2 |" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": []}))
    assert main(["bench-serve", "--resimulate", str(bad), "--out", str(out)]) == 2


def test_jittered_trace_is_seeded_and_seed_0_is_exact() -> None:
    tr = load_workload(None, 40, 1.0, max_output=7, max_prompt=100, seed=3)
    assert jittered(tr, 0.05, 0) is tr
    a, b = jittered(tr, 0.05, 1), jittered(tr, 0.05, 1)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(a.arrival_s, tr.arrival_s)
    assert sorted(a.output_tokens.tolist()) == sorted(tr.output_tokens.tolist())


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_runs_and_exits(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    rc = main(["demo", "--num-cpus", "2", "--requests", "3", "--max-tokens", "5",
               "--set", "replicas=2", "--set", "prefill_replicas=1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "demo: ok" in out and out.count('"completion_tokens": 5') == 3
