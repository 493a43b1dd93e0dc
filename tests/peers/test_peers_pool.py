"""research.peers_pool: pooling bench-peers runs of one cell (Ray-free, synthetic)."""

from __future__ import annotations

from typing import Any

import pytest

from research.peers_pool import pool

ARMS = [["sglang", "graph:br0", []], ["sglang", "smg:round_robin", []]]


def _result(starts: list[int], graph: list[float], rr: list[float],
            replicas: int = 8) -> dict[str, Any]:
    cfg = {"trace": "t.jsonl", "window": 256, "max_output": 128, "max_prompt": 16384,
           "graph": {"replicas": replicas, "slots": 4, "engine": {"slowdown": 2.0}},
           "arms": ARMS, "window_starts": starts}
    runs = []
    for i in range(len(starts)):
        for arm, tok in (("graph:br0", graph[i]), ("smg:round_robin", rr[i])):
            runs.append({"arm": arm, "window": i, "mode": "saturated",
                         "measured": {"output_tok_s": tok, "tpot_p95_ms": 100.0,
                                      "ttft_p50_ms": 1000.0}})
    return {"config": cfg, "runs": runs}


def test_pools_windows_of_both_files_as_pairs() -> None:
    a = _result([1, 2], [110.0, 120.0], [100.0, 100.0])
    b = _result([3, 4], [105.0, 115.0], [100.0, 100.0])
    out = pool([a, b])
    g = out["gains"]["smg:round_robin"]["output tok/s"]
    assert out["windows"] == 4 and g["n"] == 4
    assert g["mean"] == pytest.approx(12.5)
    assert out["best_router"] == "smg:round_robin"
    assert out["gains"]["smg:round_robin"]["TPOT P95"]["mean"] == pytest.approx(0.0)


def test_refuses_other_cells_and_shared_windows() -> None:
    a = _result([1, 2], [110.0, 120.0], [100.0, 100.0])
    with pytest.raises(ValueError, match="not one cell"):
        pool([a, _result([3, 4], [1.0, 1.0], [1.0, 1.0], replicas=4)])
    with pytest.raises(ValueError, match="appear in two files"):
        pool([a, _result([2, 5], [1.0, 1.0], [1.0, 1.0])])
