"""DyntraLB on the simulated decode ranks (br_serve.sim.dyntralb): nothing dropped or
duplicated, pauses cost the paused requests' TPOT, the bubble is kept under the
threshold where the waiting requests allow it, same seed same result, and its options
are validated and scoped by name on the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from br_serve.cli import main
from br_serve.core import ConfigError
from br_serve.core.dyntralb import bubble
from br_serve.core.state import ClusterState
from br_serve.core.step import StepModel
from br_serve.core.types import Assignment
from br_serve.sim.config import parse_sim_config
from br_serve.sim.dyntralb import DyntraLBEngine
from br_serve.sim.engine import simulate
from br_serve.sim.runner import WALL_CLOCK_KEYS
from br_serve.traces import Trace

STATIC: dict[str, Any] = {"dyntralb_bubble_threshold_blocks": 2.0, "dyntralb_mode": "static",
          "dyntralb_start_step": 0, "dyntralb_block_tokens": 16}


def _trace(n: int = 240, seed: int = 3) -> Trace:
    rng = np.random.default_rng(seed)
    prompts = np.where(rng.random(n) < 0.2, rng.integers(2000, 6000, n),
                       rng.integers(20, 400, n))
    return Trace.build(np.sort(rng.uniform(0, 20, n)), prompts, rng.integers(2, 300, n))


@pytest.mark.parametrize("saturated", [True, False])
@pytest.mark.parametrize("policy", ["jsq", "sglang_total_tokens", "consistent_hash"])
def test_every_token_once_and_pauses_cost_tpot(policy: str, saturated: bool) -> None:
    tr = _trace()
    cfg = parse_sim_config(policy=policy, replicas=4, slots=4, sim_saturated=saturated,
                           pool_capacity=64 if saturated else 65536, **STATIC)
    res = simulate(tr, cfg)
    s = res.summary()
    assert s["requests_finished"] == len(tr)
    assert s["tokens_generated"] == int(tr.output_tokens.sum())  # none lost or repeated
    fin = res.finish_steps()
    natural = res.admit_step + res.output_tokens - 1
    assert (res.admit_step >= 0).all() and (fin >= natural).all()
    assert s["dyntralb_planned_steps"] > 0 and s["dyntralb_waiting_share"] > 0
    assert (fin > natural).any()  # some request sat a step out: its TPOT grew
    first, last = res.request_times()
    assert np.all(last >= first)


def test_same_seed_same_result() -> None:
    tr = _trace()
    cfg = parse_sim_config(policy="p2c", replicas=4, slots=4, seed=5, **STATIC)

    def run() -> dict[str, object]:
        return {k: v for k, v in simulate(tr, cfg).summary().items()
                if k not in WALL_CLOCK_KEYS}

    assert run() == run()


def test_plan_keeps_the_bubble_under_the_threshold_when_it_can() -> None:
    """Rank 0 holds one 40-block and one 1-block request, rank 1 two 1-block ones and a
    waiting 30-block one; batch 2. vLLM alone would run 41 vs 2 blocks; DyntraLB's plan
    runs 30 on rank 1 in place of a 1 and the bubble falls from 19.5 to 5 blocks."""
    st = ClusterState(2, 3, step=StepModel(a_s_per_token=0.0))
    eng = DyntraLBEngine(2, 2, 8.0, 16, "static", 0, 700, 256)
    # one decoded token keeps every request in its block (639 + 1 = 40 x 16)
    for rid, g, tokens in [("a", 0, 639), ("b", 0, 15), ("c", 1, 15), ("d", 1, 15),
                           ("e", 1, 480)]:
        st.admit(Assignment(rid, g, tokens), output_tokens=100)
        eng.bind(rid, g, tokens)

    def running_blocks(mask: np.ndarray) -> list[int]:
        blk = -(-(st.prompt + st.decoded) // 16)
        return [int((blk * mask)[g].sum()) for g in range(2)]

    first = eng.begin_step(st)  # no plan yet: vLLM's own admission, in bind order
    assert running_blocks(first) == [41, 2]
    st.advance(1, where=first)
    eng.end_step(st, idle=False)
    second = eng.begin_step(st)
    loads = running_blocks(second)
    assert loads[1] == 31 and bubble(loads, 8.0) < 8.0
    assert int(second.sum()) == 4 and int(first.sum()) == 4  # batches full both times


def test_config_is_validated_by_field() -> None:
    with pytest.raises(ConfigError, match=r"dyntralb\.bubble_threshold_blocks"):
        parse_sim_config(dyntralb_bubble_threshold_blocks=0)
    with pytest.raises(ConfigError, match=r"dyntralb\.mode"):
        parse_sim_config(dyntralb_bubble_threshold_blocks=5, dyntralb_mode="sometimes")
    with pytest.raises(ConfigError, match=r"dyntralb\.bubble_threshold_blocks"):
        parse_sim_config(dyntralb_bubble_threshold_blocks=5, sim_admit_delay_steps=1)
    on = parse_sim_config(policy="jsq", slots=4, dyntralb_bubble_threshold_blocks=5)
    assert on.label == "jsq+dyntralb" and on.rank_capacity == 8
    assert parse_sim_config(slots=4).rank_capacity == 4


def _write(tmp: Path) -> Path:
    tr = _trace(120)
    p = tmp / "t.jsonl"
    p.write_text("".join(json.dumps({"arrival_s": float(a), "input_tokens": int(i),
                                     "output_tokens": int(o)}) + "\n"
                         for a, i, o in zip(tr.arrival_s, tr.input_tokens,
                                            tr.output_tokens, strict=True)))
    return p


def test_cli_runs_variants_with_scoped_engine_options(tmp_path: Path) -> None:
    out = tmp_path / "o"
    rc = main(["sim", "--trace", str(_write(tmp_path)), "--policies", "jsq,jsq-dl=jsq",
               "--replicas", "4", "--slots", "4", "--replays", "2", "--jobs", "1",
               "--engine-option", "jsq-dl.dyntralb_bubble_threshold_blocks=2",
               "--engine-option", "jsq-dl.dyntralb_mode=static",
               "--engine-option", "dyntralb_start_step=0", "--no-plots", "--out", str(out)])
    assert rc == 0
    rows = {r["label"]: r for r in json.loads((out / "summary.json").read_text())["ensemble"]}
    assert set(rows) == {"jsq", "jsq-dl"}
    assert rows["jsq"]["engine_options"] == {"dyntralb_start_step": 0}
    assert rows["jsq-dl"]["engine_options"]["dyntralb_mode"] == "static"
    assert rows["jsq-dl"]["gain_vs_baseline_mean"] is not None  # paired with jsq
    assert rows["jsq-dl"]["dyntralb_waiting_share_mean"] is not None


@pytest.mark.parametrize(("option", "message"), [
    ("nope=1", "'nope' is not an engine option"),
    ("other.dyntralb_mode=static", "'other.dyntralb_mode' names no --policies entry"),
    ("dyntralb_bubble_threshold_blocks=-1", "dyntralb.bubble_threshold_blocks"),
])
def test_cli_refuses_bad_engine_options(tmp_path: Path, option: str, message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "--trace", str(_write(tmp_path)), "--policies", "jsq", "--replicas",
               "2", "--engine-option", option, "--no-plots", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert message in capsys.readouterr().err
