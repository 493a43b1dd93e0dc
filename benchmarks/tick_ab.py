"""Tick latency of two checkouts side by side in one process, interleaved tick by tick.

A change meant to make the tick faster is judged against the code it replaces, on the
same states, in the same process, alternating tick by tick, so both see the same load
(the machine is shared). The other checkout (``--base``, e.g. a ``git worktree`` of
the previous commit) is imported under its own module names before this one.

Usage::

    git worktree add /tmp/base HEAD~1
    python -m benchmarks.tick_ab --base /tmp/base [-G 16] [-N 1024] [--ticks 3000]

Prints, per configuration of ``tick_compare.CONFIGS``, both P50s, the median of the
per-tick paired ratio new / base, and checks that both made the same assignments.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from benchmarks.tick_compare import CONFIGS, add_state_args, finish

_PREFIXES = ("br_serve", "predictors")


def _load(root: str, build: Callable[[dict[str, ModuleType]], Any]) -> Any:
    """``build`` with the policy API of checkout ``root``, then detach its modules (what
    ``build`` made keeps its own module globals; the next checkout imports afresh)."""
    def drop() -> None:
        for k in [k for k in sys.modules if k.split(".")[0] in _PREFIXES]:
            del sys.modules[k]
    drop()
    try:
        for top in _PREFIXES:  # the top packages from ``root``; their submodules follow
            spec = importlib.machinery.PathFinder.find_spec(top, [root])
            if spec is None or spec.loader is None:
                raise SystemExit(f"--base: no package {top!r} in {root}")
            sys.modules[top] = mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        mods = {n: importlib.import_module(n) for n in
                ("br_serve.core", "br_serve.bench.tick", "predictors")}
        return build(mods)
    finally:
        drop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the other checkout's root")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    add_state_args(p, ticks=3000)
    a = p.parse_args()

    def build(m: dict[str, ModuleType]) -> list[Any]:
        pols = []
        for _, name, pred_name, opts in CONFIGS:
            pred = None
            if pred_name is not None:
                pred = m["predictors"].make_predictor(pred_name,
                                                      horizon=int(opts.get("horizon", 80)))
                wr = np.random.default_rng(a.seed + 1)
                m["predictors"].warm_start(
                    pred, wr.lognormal(7.5, 1.2, a.warm_start).astype(np.int64),
                    wr.integers(1, 2080, a.warm_start))
            core = m["br_serve.core"]
            pols.append(core.build_policy(name, opts, core.PolicyContext(predictor=pred)))
        return pols

    # one set of states (built by this checkout) for both sides: the same inputs
    from br_serve.bench.tick import make_state
    rng = np.random.default_rng(a.seed)
    states = [make_state(rng, a.replicas, a.slots, a.pool,
                         prompt_median_tokens=a.prompt_median) for _ in range(a.states)]
    sides = {"base": os.path.abspath(a.base), "new": here}
    built = {k: _load(root, build) for k, root in sides.items()}
    n_cfg = len(CONFIGS)
    lat = {k: np.zeros((n_cfg, a.ticks)) for k in sides}
    same = np.ones(n_cfg, dtype=bool)
    clock = time.perf_counter_ns
    load0 = os.getloadavg()
    for i in range(50 + a.ticks):
        for j in range(n_cfg):
            order = ("base", "new") if (i + j) % 2 == 0 else ("new", "base")
            got = {}
            for side in order:
                pols = built[side]
                s, pl = states[i % len(states)]
                t0 = clock()
                res = pols[j].schedule(s, pl, 0.0, 0)
                dt = clock() - t0
                got[side] = [(x.request_id, x.replica) for x in res.assignments]
                if i >= 50:
                    lat[side][j, i - 50] = dt
            same[j] &= got["base"] == got["new"]
    load1 = os.getloadavg()
    rows = []
    for j, (label, *_rest) in enumerate(CONFIGS):
        b, n = lat["base"][j] / 1e3, lat["new"][j] / 1e3
        rows.append({"config": label, "base_p50_us": round(float(np.median(b)), 1),
                     "new_p50_us": round(float(np.median(n)), 1),
                     "paired_ratio_p50": round(float(np.median(n / b)), 3),
                     "same_assignments": bool(same[j])})
        r = rows[-1]
        print(f"{label:<44} base {r['base_p50_us']:7.1f}  new {r['new_p50_us']:7.1f} us"
              f"  new/base {r['paired_ratio_p50']:.3f}  same: {r['same_assignments']}")
    finish(a, rows, load0, load1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
