"""``br-serve sim`` end to end on a small trace written by the test."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from br_serve.cli import main

KEYS = {"policy", "predictor", "replicas", "slots", "mean_imbalance_tokens",
        "throughput_tok_s", "tpot_p50_ms", "tpot_p95_ms", "ttft_p95_ms", "steps",
        "requests_finished", "tick_p50_us", "tick_p99_us", "balanced_bound_tok_s"}


def _trace(tmp: Path, bad: bool = False) -> Path:
    rows = [json.dumps({"arrival_s": 0.05 * i, "input_tokens": 100 + 37 * (i % 11),
                        "output_tokens": 5 + (i * 7) % 40}) for i in range(60)]
    if bad:
        rows.insert(10, '{"arrival_s": "soon", "input_tokens": 1, "output_tokens": 1}')
    p = tmp / "t.jsonl"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_sim_cli_writes_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["sim", "--trace", str(_trace(tmp_path)), "--policies", "jsq,br0,brh",
               "--predictor", "oracle,survives", "--replicas", "2,3", "--slots", "4",
               "--out", str(out), "--series-max-rows", "50"])
    assert rc == 0
    doc = json.loads((out / "summary.json").read_text())
    runs = doc["runs"]
    assert len(runs) == 8  # (jsq, br0, brh+oracle, brh+survives) x (G=2, G=3)
    assert {(r["label"], r["replicas"]) for r in runs} >= {("brh+oracle", 3), ("jsq", 2)}
    for r in runs:
        assert set(r) >= KEYS
        assert r["requests_finished"] == 60
        table = pq.read_table(out / r["series_file"])
        assert table.num_rows <= 50
        assert r["series_stride"] >= 1
        assert (out / r["loads_file"]).exists()
    assert doc["trace"]["requests"] == 60
    md = (out / "results.md").read_text()
    assert md.count("\n") == 2 + len(runs)
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == sorted(f"{k}_G{g}_trace.png" for k in ("imbalance", "loads", "throughput")
                          for g in (2, 3))
    assert "brh+oracle" in capsys.readouterr().out


def test_sim_cli_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path, bad=True)
    rc = main(["sim", "--trace", str(trace), "--policies", "jsq", "--replicas", "2",
               "--out", str(tmp_path / "o"), "--no-plots"])
    assert rc == 2
    assert "t.jsonl:11: arrival_s" in capsys.readouterr().err
    rc = main(["sim", "--trace", str(trace), "--policies", "jsq", "--replicas", "2",
               "--out", str(tmp_path / "o"), "--no-plots", "--skip-bad"])
    assert rc == 0
    assert "skipped 1 malformed line" in capsys.readouterr().err


def test_sim_cli_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_trace(tmp_path))
    assert main(["sim", "--trace", trace, "--policies", "nope", "--out", str(tmp_path)]) == 2
    assert "policy" in capsys.readouterr().err
    assert main(["sim", "--trace", trace, "--replicas", "0", "--out", str(tmp_path)]) == 2
    assert "replicas" in capsys.readouterr().err
    assert main(["sim", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path)]) == 2
    assert "none.csv" in capsys.readouterr().err
