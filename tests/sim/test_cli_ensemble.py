"""``br-serve sim --replays`` and ``br-serve capacity`` end to end, bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from br_serve.cli import main


def _trace(tmp: Path, n: int = 200) -> Path:
    rows = [json.dumps({"arrival_s": 0.2 * i, "input_tokens": 50 + 97 * (i % 13),
                        "output_tokens": 3 + (i * 7) % 45}) for i in range(n)]
    p = tmp / "t.jsonl"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_sim_replays_write_runs_and_ensemble(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    rc = main(["sim", "--trace", str(_trace(tmp_path)), "--policies", "jsq,br0,brh",
               "--predictor", "oracle", "--replicas", "2", "--slots", "4", "--sim-saturated",
               "--replays", "3", "--limit", "80", "--jobs", "1", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "summary.json").read_text())
    assert [(r["label"], r["replay"]) for r in doc["runs"]][:3] == [
        ("jsq", 0), ("br0", 0), ("brh+oracle", 0)]
    assert len(doc["runs"]) == 9 and doc["replay_mode"] == "window"
    assert {r["label"] for r in doc["ensemble"]} == {"jsq", "br0", "brh+oracle"}
    row = next(r for r in doc["ensemble"] if r["label"] == "br0")
    assert row["replays"] == 3 and row["baseline"] == "jsq"
    assert len(row["gain_vs_baseline_ci95"]) == 2
    assert [r["requests"] for r in doc["replays"]] == [80, 80, 80]
    md = (out / "results.md").read_text()
    assert md.count("\n") == 2 + 3 and "baseline" in md
    assert (out / "plots" / "gain_G2_saturated.png").exists()
    assert "gain vs jsq" in capsys.readouterr().out


def test_sim_stationary_and_single_replay(tmp_path: Path) -> None:
    tr = str(_trace(tmp_path))
    out = tmp_path / "st"
    assert main(["sim", "--trace", tr, "--policies", "jsq,br0", "--replicas", "1",
                 "--slots", "2", "--stationary", "--replays", "2", "--limit", "100",
                 "--jobs", "1", "--no-plots", "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert doc["mode"] == "stationary"
    assert all(r["mode"] == "stationary" and r["pool_depth"] == 8 for r in doc["runs"])
    assert "representative" in (out / "results.md").read_text()
    one = tmp_path / "one"  # without --replays: one run per config, plus K = 1 rows
    assert main(["sim", "--trace", tr, "--policies", "jsq,br0", "--replicas", "2",
                 "--no-plots", "--out", str(one)]) == 0
    doc = json.loads((one / "summary.json").read_text())
    assert [r["replay"] for r in doc["runs"]] == [0, 0]
    assert [r["replays"] for r in doc["ensemble"]] == [1, 1]
    assert doc["ensemble"][1]["gain_vs_baseline_se"] is None
    assert (one / "series").is_dir()


@pytest.mark.parametrize(("argv", "field"), [
    (["--replays", "0", "--limit", "50", "--sim-saturated"], "replays"),
    (["--replays", "2", "--replay-mode", "shuffle"], "--replay-mode"),
    (["--replays", "2", "--limit", "500", "--sim-saturated"], "limit"),
    (["--replays", "2", "--sim-saturated"], "--limit"),
    (["--replays", "2", "--limit", "50", "--sim-saturated", "--baseline", "p2c"], "baseline"),
    (["--stationary", "--replays", "2", "--limit", "60"], "limit"),
])
def test_sim_bad_ensemble_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                argv: list[str], field: str) -> None:
    rc = main(["sim", "--trace", str(_trace(tmp_path)), "--policies", "jsq,br0",
               "--replicas", "2", "--jobs", "1", "--no-plots", "--out", str(tmp_path / "o"),
               *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"error: {field}:" in err, err


def test_capacity_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = str(_trace(tmp_path))
    out = tmp_path / "cap"
    rc = main(["capacity", "--trace", tr, "--policies", "jsq,br0", "--replicas", "2",
               "--slots", "4", "--slo-tpot-p95-ms", "40", "--slo-ttft-p95-s", "2",
               "--replays", "2", "--rate-tol", "0.05", "--jobs", "1", "--out", str(out),
               "--json", "--no-plots"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    doc = json.loads((out / "capacity.json").read_text())
    assert printed["runs"] == doc["runs"]
    assert [r["label"] for r in doc["runs"]] == ["jsq", "br0"]
    for r in doc["runs"]:
        assert set(r) >= {"policy", "predictor", "replicas", "capacity_req_s",
                          "capacity_vs_baseline", "tpot_p95_ms", "ttft_p95_s"}
        assert r["met"] and r["capacity_req_s"] > 0
        assert r["tpot_p95_ms"] <= 40 and r["ttft_p95_s"] <= 2
    assert doc["slo"] == {"tpot_p95_ms": 40.0, "ttft_p95_s": 2.0}
    # an SLO below one unloaded step: capacity 0, said on stderr and in the JSON
    rc = main(["capacity", "--trace", tr, "--policies", "jsq", "--replicas", "2",
               "--slo-tpot-p95-ms", "20", "--slo-ttft-p95-s", "2", "--replays", "1",
               "--jobs", "1", "--out", str(out), "--no-plots"])
    assert rc == 0
    cap = capsys.readouterr()
    assert "no rate can meet the SLO" in cap.err and "| 0.000 |" in cap.out
    assert main(["capacity", "--trace", tr, "--policies", "jsq", "--slo-tpot-p95-ms", "0",
                 "--slo-ttft-p95-s", "2", "--out", str(out)]) == 2
    assert "slo_tpot_p95_ms:" in capsys.readouterr().err
    assert main(["capacity", "--trace", tr, "--policies", "jsq", "--slo-tpot-p95-ms", "50",
                 "--slo-ttft-p95-s", "2", "--replays", "0", "--out", str(out)]) == 2
    assert "replays:" in capsys.readouterr().err
