"""``br-serve sim`` with the FCFS-replay fairness split at the start-up fill.

A saturated window starts with every slot free: FCFS (the baseline ``jsq``'s replay)
starts its first ``replicas x slots`` requests at once, and a request BalanceRoute
skipped then waits for the first release, however the rest of the run goes
(docs/core.md, "Fairness: measured"). This runs the simulator's CLI unchanged and adds
to every run row, beside ``fcfs_rule_excess_s_p99`` / ``_max`` (``TTFT - 2 x
TTFT_fcfs`` over all requests), the same over the fill's requests (``fill_``) and
over the rest (``rest_``), and how many requests of each exceed 30 s.

    python research/policy/fill_split.py sim --trace ... --sim-saturated ... --out DIR
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import br_serve.sim.ensemble as ensemble
from br_serve.sim.ensemble import FCFS_RULE_FACTOR

_plain = ensemble.fcfs_replay_fairness


def _split(run: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(_plain(run, base))
    mine = run.get("_ttft_s")
    theirs = None if base is None else base.get("_ttft_s")
    if mine is None or theirs is None or len(mine) != len(theirs):
        return out
    excess = np.asarray(mine, dtype=np.float64) - FCFS_RULE_FACTOR * np.asarray(
        theirs, dtype=np.float64)
    fill = np.arange(excess.size) < int(run["replicas"]) * int(run["slots"])
    for name, part in (("fill", fill), ("rest", ~fill)):
        x = excess[part & np.isfinite(excess)]
        if x.size:
            out[f"{name}_rule_excess_s_p99"] = float(np.percentile(x, 99))
            out[f"{name}_rule_excess_s_max"] = float(x.max())
            out[f"{name}_over_30s"] = int((x > 30.0).sum())
    return out


if __name__ == "__main__":
    from br_serve.cli import main

    ensemble.fcfs_replay_fairness = _split  # the CLI's ensemble reads it at assembly
    sys.exit(main(sys.argv[1:]))
