"""A policy with one option, written to a temporary module at run time, runs through
``br-serve sim``, ``br-serve bench-tick`` and the live Serve graph (``policy=NAME
policy_options=...``) without touching any file of the package: one policy = one file.

The module is found by its qualified name (``package.module.Class``). For the live
graph it must be importable on the Ray workers, so it lives on ``PYTHONPATH`` from
before the module's cluster starts. The policy logs every option value it schedules
with, which proves the option reached the scheduler actor.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from br_serve.cli import main
from tests.serve.helpers import free_port, start_ray

PLUGIN = "br_test_plugin_policy"
NAME = f"{PLUGIN}.EveryOther"
SOURCE = '''
"""A test policy: FCFS, to the feasible replica with the fewest running requests
counted in units of ``spread`` (so ``spread`` changes its choices)."""

import os
from dataclasses import dataclass

from br_serve.core import Options, option
from br_serve.core.policies.fcfs import FCFSPolicy


@dataclass(frozen=True, slots=True)
class EveryOtherOptions(Options):
    spread: int = option(1, ge=1, doc="running requests counted per unit")


class EveryOther(FCFSPolicy[EveryOtherOptions]):
    Options = EveryOtherOptions

    def choose(self, req, feasible, led):
        log = os.environ.get("BR_PLUGIN_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{self.options.spread}\\n")
        return min(feasible, key=lambda g: (led.running[g] // self.options.spread, g))
'''


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("plugin")
    (d / f"{PLUGIN}.py").write_text(textwrap.dedent(SOURCE))
    old_path, old_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(d))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(d), old_env) if p)
    log = d / "calls.log"
    os.environ["BR_PLUGIN_LOG"] = str(log)
    yield d
    sys.path[:] = old_path
    os.environ.pop("BR_PLUGIN_LOG", None)
    if old_env is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old_env


def _calls(d: Path) -> list[int]:
    p = d / "calls.log"
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def _trace(tmp: Path) -> Path:
    rows = [json.dumps({"arrival_s": 0.05 * i, "input_tokens": 100 + 37 * (i % 11),
                        "output_tokens": 5 + (i * 7) % 40}) for i in range(40)]
    p = tmp / "t.jsonl"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_simulator_runs_the_plugin_with_its_option(plugin_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = len(_calls(plugin_dir))
    assert main(["sim", "--trace", str(_trace(tmp_path)), "--policies", f"{NAME},jsq",
                 "--policy-option", "spread=3", "--replicas", "3", "--slots", "4",
                 "--no-plots", "--out", str(out)]) == 0
    runs = json.loads((out / "summary.json").read_text())["runs"]
    mine = next(r for r in runs if r["policy"] == NAME)
    assert mine["policy_options"] == {"spread": 3} and mine["requests_finished"] == 40
    assert set(_calls(plugin_dir)[before:]) == {3}
    # an option no listed policy has is refused by name, never dropped
    assert main(["sim", "--trace", str(_trace(tmp_path)), "--policies", NAME,
                 "--policy-option", "spred=3", "--out", str(out)]) == 2


def test_bench_tick_runs_the_plugin(plugin_dir: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-tick", "--policy", NAME, "--policy-option", "spread=2",
                 "--replicas", "4", "--pool", "64", "--ticks", "20", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["policy"] == NAME and row["options"] == {"spread": 2}
    assert main(["bench-tick", "--policy", NAME, "--policy-option", "spread=0"]) == 2
    assert "spread:" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_live_graph_runs_the_plugin(plugin_dir: Path) -> None:
    import ray
    from ray import serve

    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    start_ray()
    try:
        port = free_port()
        before = len(_calls(plugin_dir))
        # builder arguments as `serve run graphs.balance_route:build ...` hands them
        deploy(parse_graph_config({"replicas": "2", "prefill_replicas": "1",
                                   "serve_port": str(port), "step_b_s": "0.005",
                                   "policy": NAME, "policy_options": '{"spread": 2}'}))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            for i in range(3):
                r = c.post("/v1/completions", json={"model": "br-emulated",
                                                    "prompt": f"hello {i}", "max_tokens": 4})
                assert r.status_code == 200, r.text
            state = c.get("/v1/br/state").json()
        assert state["policy"] == NAME
        deadline = time.monotonic() + 10
        while len(_calls(plugin_dir)) - before < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(_calls(plugin_dir)[before:]) == {2}
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
