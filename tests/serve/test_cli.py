"""``br-serve demo`` / ``bench-serve`` / ``serve``: argument errors and bench helpers (no Ray),
plus the bounded demo end to end (its own local Ray; slow)."""

from __future__ import annotations

import numpy as np
import pytest

from br_serve.cli import main
from br_serve.serve.bench import _gains, format_table, load_workload


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
    assert any(w in err for w in ("replicas:", "policy:", "--set:", "transport:"))


def test_missing_trace_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-serve", "--trace", "/nonexistent/t.jsonl"]) == 2
    assert "/nonexistent/t.jsonl" in capsys.readouterr().err


def test_workload_clips_and_scales() -> None:
    tr = load_workload(None, 50, 0.5, max_output=7, max_prompt=100, seed=3)
    assert len(tr) == 50
    assert tr.output_tokens.max() <= 7 and tr.input_tokens.max() <= 100
    ref = load_workload(None, 50, 1.0, max_output=7, max_prompt=100, seed=3)
    assert np.allclose(tr.arrival_s, ref.arrival_s * 0.5)


def _row(pol: str, thr: float, model_thr: float, sim: float | None) -> dict[str, object]:
    meas = {"throughput_tok_s": thr, "model_throughput_tok_s": model_thr,
            "tpot_p95_ms": 80.0, "mean_imbalance_tokens": 1000.0, "requests_lost": 0,
            "bad_tokens": 0, "tick_dispatch_share_of_step": 0.01}
    simd = None if sim is None else {"throughput_tok_s": sim, "tpot_p95_ms": 70.0,
                                     "mean_imbalance_tokens": 900.0}
    return {"policy": pol, "measured": meas, "simulated": simd}


def test_gains_against_jsq() -> None:
    rows = [_row("jsq", 100.0, 200.0, 400.0), _row("br0", 110.0, 230.0, 440.0)]
    g = _gains(rows)["br0_over_jsq"]
    assert g["measured_pct"] == pytest.approx(10.0)
    assert g["measured_model_time_pct"] == pytest.approx(15.0)
    assert g["simulated_pct"] == pytest.approx(10.0)
    assert g["difference_pp"] == pytest.approx(0.0)
    assert g["model_time_difference_pp"] == pytest.approx(5.0)
    text = format_table({"rows": rows, "gains": _gains(rows)})
    assert "| br0 | 110.0 / 440.0 | 230.0 |" in text
    assert _gains([_row("br0", 1.0, 1.0, None)]) == {}


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
