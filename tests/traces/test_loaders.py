"""Each loader on small samples written in the real formats; errors name file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from br_serve.traces import (
    SyntheticSpec,
    detect_format,
    load_trace,
    parse_wallclock_s,
    synthetic_trace,
)
from br_serve.traces.synthetic import LengthDist

AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:05.5000000,100,250
"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.009930+00:00,2162,1339
2024-05-10 00:00:01.509930+00:00,374,1
2024-05-09 23:59:59.009930-01:00,10,20
"""
SERVEGEN = """arrival_s,input_tokens,output_tokens,reason_ratio
0.0000,170,245,0.5700
0.2500,216,422,0.7380
3.0000,1,1001,0.1
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
46,GPT-4,417,62,479,API log
"""


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def test_azure_2023(tmp_path: Path) -> None:
    p = _write(tmp_path, "a.csv", AZURE_2023)
    tr = load_trace(p)
    assert tr.source.startswith("azure:")
    np.testing.assert_allclose(tr.arrival_s, [0.0, 0.052, 1.52004], atol=1e-6)
    assert tr.input_tokens.tolist() == [4808, 3180, 100]
    assert tr.output_tokens.tolist() == [10, 8, 250]
    assert tr.hash_ids is None


def test_azure_2024_offsets_and_sorting(tmp_path: Path) -> None:
    tr = load_trace(_write(tmp_path, "b.csv", AZURE_2024), "azure")
    # 23:59:59 at -01:00 is 00:59:59 UTC: the last of the three after sorting.
    np.testing.assert_allclose(tr.arrival_s, [0.0, 1.5, 3599.0], atol=1e-6)
    assert tr.input_tokens.tolist() == [2162, 374, 10]


def test_wallclock_parser() -> None:
    assert parse_wallclock_s("1970-01-02 00:00:01.5") == pytest.approx(86401.5)
    assert parse_wallclock_s("1970-01-01T01:00:00Z") == pytest.approx(3600.0)
    assert parse_wallclock_s("1970-01-01 01:00:00+01:00") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="TIMESTAMP"):
        parse_wallclock_s("yesterday")


def test_mooncake(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]},
            {"timestamp": 3000, "input_length": 100, "output_length": 3, "hash_ids": [0]},
            {"timestamp": 1500, "input_length": 7, "output_length": 9, "hash_ids": []}]
    p = _write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    assert detect_format(p) == "mooncake"
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == [0.0, 1.5, 3.0]
    assert tr.output_tokens.tolist() == [500, 9, 3]
    assert tr.hash_ids == ((0, 1), (), (0,))


def test_canonical_jsonl_and_servegen(tmp_path: Path) -> None:
    rows = [{"arrival_s": 2.0, "input_tokens": 5, "output_tokens": 6},
            {"arrival_s": 2.5, "input_tokens": 7, "output_tokens": 8, "hash_ids": [4]}]
    p = _write(tmp_path, "c.jsonl", "\n".join(json.dumps(r) for r in rows))
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == [0.0, 0.5]
    assert tr.hash_ids == ((), (4,))
    sg = load_trace(_write(tmp_path, "s.csv", SERVEGEN))
    assert sg.source.startswith("servegen:")
    assert sg.output_tokens.tolist() == [245, 422, 1001]


def test_burstgpt_drops_failed(tmp_path: Path) -> None:
    tr = load_trace(_write(tmp_path, "g.csv", BURSTGPT))
    assert tr.source.startswith("burstgpt:")
    assert tr.arrival_s.tolist() == [0.0, 41.0]
    assert tr.input_tokens.tolist() == [472, 417]
    assert tr.dropped_rows == 1


def test_filters(tmp_path: Path) -> None:
    p = _write(tmp_path, "s.csv", SERVEGEN)
    assert load_trace(p, min_output=300).output_tokens.tolist() == [422, 1001]
    assert load_trace(p, max_output=300).output_tokens.tolist() == [245]
    assert load_trace(p, limit=2).output_tokens.tolist() == [245, 422]
    win = load_trace(p, start_s=0.1, end_s=5.0)
    assert win.arrival_s.tolist() == [0.0, 2.75]
    assert load_trace(p, arrival_scale=2.0).arrival_s.tolist() == [0.0, 0.5, 6.0]
    with pytest.raises(ValueError, match="arrival_scale"):
        load_trace(p, arrival_scale=0)
    with pytest.raises(ValueError, match="min_output"):
        load_trace(p, min_output=5, max_output=4)


@pytest.mark.parametrize(("name", "text", "lineno", "what"), [
    ("bad.csv", SERVEGEN.replace("0.2500,216", "0.2500,abc"), 3, "input_tokens"),
    ("bad2.csv", AZURE_2023.replace("2023-11-16 18:17:04", "2023-13-16 18:17:04"), 3,
     "TIMESTAMP"),
    ("bad3.csv", SERVEGEN.replace("3.0000,1,1001,0.1", "3.0,1"), 4, "fields"),
    ("bad.jsonl", '{"arrival_s": 0, "input_tokens": 1, "output_tokens": 2}\n{oops\n', 2,
     "JSON"),
    ("bad2.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 2}\n\n'
     '{"timestamp": 1, "input_length": -1, "output_length": 2}\n', 3, "input_length"),
    ("bad3.jsonl", '{"arrival_s": 0, "input_tokens": 1, "output_tokens": 2}\n'
     '{"arrival_s": 0, "input_tokens": 1}\n', 2, "output_tokens"),
])
def test_malformed_line_named(tmp_path: Path, name: str, text: str, lineno: int,
                              what: str) -> None:
    p = _write(tmp_path, name, text)
    with pytest.raises(ValueError, match=f"{name}:{lineno}: .*{what}"):
        load_trace(p)
    tr = load_trace(p, skip_bad=True)
    assert tr.skipped_lines == 1
    assert len(tr) >= 1


def test_detection_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"x.csv:1: header"):
        load_trace(_write(tmp_path, "x.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(ValueError, match="format: unknown"):
        load_trace(_write(tmp_path, "y.csv", SERVEGEN), "parquet")
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.csv")


def test_synthetic_seeded_and_shaped() -> None:
    spec = SyntheticSpec(requests=20000, rate_per_s=50.0, seed=7,
                         output=LengthDist(median=300, sigma=0.5, max_tokens=100000))
    a, b = synthetic_trace(spec), synthetic_trace(spec)
    assert (a.arrival_s == b.arrival_s).all() and (a.output_tokens == b.output_tokens).all()
    c = synthetic_trace(spec.model_copy(update={"seed": 8}))
    assert not (a.output_tokens == c.output_tokens).all()
    assert np.median(a.output_tokens) == pytest.approx(300, rel=0.05)
    assert len(a) / a.duration_s == pytest.approx(50.0, rel=0.05)
    bursty = synthetic_trace(spec.model_copy(update={"arrival": "bursty"}))
    assert len(bursty) == 20000
    assert len(bursty) / bursty.duration_s == pytest.approx(50.0, rel=0.3)
    # burstier than Poisson: the squared coefficient of variation of gaps exceeds 1
    gaps = np.diff(bursty.arrival_s)
    assert gaps.var() / gaps.mean() ** 2 > 1.5
    par = synthetic_trace(SyntheticSpec(requests=20000, seed=1, output=LengthDist(
        kind="pareto", median=200, alpha=1.2, min_tokens=1, max_tokens=10**6)))
    assert np.median(par.output_tokens) == pytest.approx(200, rel=0.1)
    sat = synthetic_trace(spec.model_copy(update={"arrival": "saturated"}))
    assert (sat.arrival_s == 0).all()
