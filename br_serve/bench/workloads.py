"""The workloads and protocol constants the simulator benchmarks share.

``benchmarks/results.py`` (docs/results.md), ``benchmarks/time_aware.py`` and the research
scripts under ``research/`` replay the same four workloads of the shared trace set under
the same stationary protocol and step model; they import them from here (one definition,
no script importing another).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from br_serve.sim import parse_sim_config
from br_serve.sim.stationary import Stationary
from br_serve.traces import Trace, load_trace


def _traces_dir() -> Path:
    """``shared/traces`` beside the checkout (a worktree may sit one level deeper), found
    from this file (an editable install) or from the working directory."""
    for up in [*Path(__file__).resolve().parents, *Path.cwd().resolve().parents, Path.cwd()]:
        if (up / "shared" / "traces").is_dir():
            return up / "shared" / "traces"
    return Path("shared/traces")


TRACES = _traces_dir()
WORKLOADS: dict[str, dict[str, Any]] = {
    "servegen-r1": dict(path=TRACES / "servegen" / "deepseek_r1_5rps_1h.csv",
                        min_output=1001),
    # ServeGen draws inputs and outputs from one uniform number (rank-correlated); this
    # variant permutes the outputs (seeded) to isolate the placement effect
    "servegen-r1-shuffled": dict(path=TRACES / "servegen" / "deepseek_r1_5rps_1h.csv",
                                 min_output=1001, shuffle_outputs=True),
    "mooncake-conv": dict(path=TRACES / "mooncake" / "conversation_trace.jsonl",
                          min_output=None),
    "azure-conv": dict(path=TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv",
                       min_output=None),
}
STATIONARY_G = (4, 8, 16)
#: stationary protocol of the results: a warm-up and a measured window of at least this
#: many admissions each. Long against the pool depth and against how long a policy may
#: defer a request: br0's default ageing releases a request after 1,024 overtakes, and
#: with the library's minimal warm-up (pool depth + 2 x slots) its Mooncake admissions
#: were 20% larger than FCFS's in every replay (the deferred backlog of the warm-up being
#: paid back), with 4,096 they matched within 1%.
STATIONARY_MIN_ADMISSIONS = 4096
#: a replay window takes at most this share of the trace (so K windows still differ);
#: warm-up and window shrink together to fit
STATIONARY_MAX_SHARE = 0.8


def stationary_plan(g: int, slots: int, n: int) -> tuple[Stationary, int]:
    """(protocol, requests per replay) for G replicas on a trace of ``n`` requests."""
    cfg = parse_sim_config(replicas=g, slots=slots)
    depth = Stationary().depth(cfg)
    warm = max(depth + 2 * g * slots, STATIONARY_MIN_ADMISSIONS)
    window = max(8 * g * slots, STATIONARY_MIN_ADMISSIONS)
    room = int(STATIONARY_MAX_SHARE * n) - depth
    if warm + window > room:
        warm = max(depth + 2 * g * slots, room * warm // (warm + window))
        window = room - warm
    return Stationary(warmup_admissions=warm), depth + warm + window


SLO_TPOT_FACTOR, SLO_TTFT_S = 1.25, 10.0
STEP_A, STEP_B = 5e-7, 0.03


def load_workload(name: str, seed: int = 0) -> Trace:
    """Workload ``name`` of :data:`WORKLOADS` (``seed``: the shuffled variant's permutation)."""
    spec = WORKLOADS[name]
    tr = load_trace(spec["path"], min_output=spec["min_output"])
    if spec.get("shuffle_outputs"):
        perm = np.random.default_rng(seed).permutation(len(tr))
        tr = Trace.build(tr.arrival_s, tr.input_tokens, tr.output_tokens[perm], tr.hash_ids,
                         source=tr.source + ":shuffled-outputs")
    return tr
