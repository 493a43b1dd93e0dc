"""The ensemble side of ``br-serve sim`` and the ``br-serve capacity`` command.

``br-serve sim ... --replays K`` runs every planned configuration on the same K replays
(:mod:`br_serve.sim.ensemble`) and writes ``summary.json`` (``runs``: one row per
configuration and replay, with ``replay``; ``ensemble``: one row per configuration),
``results.md`` (the ensemble table) and ``plots/gain_G<g>_<mode>.png``. Without
``--replays``, ``--replay-mode`` or ``--stationary`` the command simulates the trace once
per configuration as before (and also writes the K = 1 ``ensemble`` rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from br_serve.sim.config import SimConfig
from br_serve.sim.replays import REPLAY_MODES
from br_serve.sim.runner import RunSpec, default_jobs
from br_serve.sim.stationary import Stationary
from br_serve.traces import Trace


def add_ensemble_args(p: argparse.ArgumentParser, capacity: bool = False) -> None:
    """The replay / ensemble options shared by ``sim`` and ``capacity``."""
    p.add_argument("--replays", type=int, default=None,
                   help="K paired replays per configuration (default 1; capacity: 8)")
    p.add_argument("--replay-mode", default=None,
                   help=f"{' | '.join(REPLAY_MODES[:3])}: random windows of --limit "
                   "requests (saturated default), arrival jitter (trace-timed default), or "
                   "the seed only")
    p.add_argument("--jitter-ms", type=float, default=50.0,
                   help="arrival jitter s.d. for --replay-mode jitter (ms)")
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes (default: the machine's cores); results do not "
                   "depend on it")
    p.add_argument("--baseline", default="jsq", help="label the gains are paired against")
    if not capacity:
        p.add_argument("--stationary", action="store_true",
                       help="stationary saturated mode: pool kept at --pool-depth, metrics "
                       "after a warm-up (implies --sim-saturated)")
        p.add_argument("--pool-depth", type=int, default=None,
                       help="stationary pool depth (default 4 x replicas x slots)")
        p.add_argument("--warmup-admissions", type=int, default=None,
                       help="stationary warm-up (default pool depth + 2 x replicas x slots)")


def wants_ensemble(args: argparse.Namespace) -> bool:
    return (args.replays is not None or args.replay_mode is not None
            or bool(getattr(args, "stationary", False)))


def replay_mode(args: argparse.Namespace, saturated: bool) -> str:
    if args.replay_mode is not None:
        if args.replay_mode not in REPLAY_MODES[:3]:
            raise ValueError(f"--replay-mode: unknown {args.replay_mode!r}; known: "
                             f"{', '.join(REPLAY_MODES[:3])}")
        return str(args.replay_mode)
    return "window" if saturated else "jitter"


def _limit(args: argparse.Namespace, mode: str) -> int | None:
    if mode == "window" and args.limit is None:
        raise ValueError("--limit: --replay-mode window needs the window length")
    return args.limit if mode == "window" else None


def run_sim_ensemble(args: argparse.Namespace, trace: Trace, specs: Sequence[RunSpec],
                     history: Trace | None, meta: dict[str, Any]) -> int:
    """``br-serve sim`` with replays: run, print, write (see the module docstring)."""
    from br_serve.sim.ensemble import run_ensemble
    from br_serve.sim.ensemble_output import ensemble_table, plot_ensembles

    stationary = (Stationary(pool_depth=args.pool_depth,
                             warmup_admissions=args.warmup_admissions)
                  if args.stationary else None)
    saturated = specs[0].config.sim.saturated or stationary is not None
    mode = replay_mode(args, saturated)
    k = 1 if args.replays is None else args.replays
    t0 = time.perf_counter()
    ens = run_ensemble(trace, specs, replays=k, replay_mode=mode, limit=_limit(args, mode),
                       jitter_ms=args.jitter_ms, seed=specs[0].config.seed, baseline=args.baseline,
                       stationary=stationary, warm_start=history,
                       jobs=default_jobs() if args.jobs is None else args.jobs,
                       progress=_bar(args.progress))
    for r in ens.ensemble:
        print(f"{r['label']:>24} G={r['replicas']:<3} K={r['replays']} thr "
              f"{r['throughput_tok_s_mean'] or 0:>9,.1f} tok/s | gain vs {args.baseline} "
              f"{_gain(r)} | imbalance {r['mean_imbalance_tokens_mean'] or 0:,.0f} | TPOT "
              f"p95 {r['tpot_p95_ms_mean'] or 0:.1f} ms", flush=True)
    print(f"sim: {len(ens.runs)} runs in {time.perf_counter() - t0:.1f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {**ens.to_dict(), **meta}
    (out / "summary.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "results.md").write_text(ensemble_table(ens.ensemble))
    if not args.no_plots:
        plot_ensembles(ens.ensemble, out / "plots")
    print(f"sim: wrote {out}/summary.json, results.md{'' if args.no_plots else ', plots/'}")
    return 0


def _gain(r: dict[str, Any]) -> str:
    from br_serve.sim.ensemble_output import ci_cell, gain_cell

    ci = ci_cell(r)
    return gain_cell(r) + ("" if ci == "-" else f" {ci}")


def _bar(on: bool) -> Any:
    if not on:
        return None

    def cb(done: int, total: int) -> None:
        print(f"\r{done}/{total} runs", end="" if done < total else "\n", file=sys.stderr,
              flush=True)
    return cb


def single_replay_ensemble(doc: dict[str, Any], trace: Trace, configs: Sequence[SimConfig],
                           baseline: str, out_dir: str | Path) -> None:
    """Add ``replay = 0`` and the K = 1 ``ensemble`` rows to a plain ``sim`` run's
    ``summary.json`` (gains against ``baseline`` when it was run; no intervals)."""
    from br_serve.sim.ensemble import assemble
    from br_serve.sim.replays import Replay

    for r in doc["runs"]:
        r.setdefault("replay", 0)
    specs = [RunSpec(c) for c in configs]
    rows = [dict(r) for r in doc["runs"]]
    ens = assemble(specs, [Replay(0, trace, configs[0].seed, 0, "none")], rows, baseline,
                   "none", None)
    doc["ensemble"] = ens.ensemble
    doc["baseline"] = baseline if any(s.name == baseline for s in specs) else None
    (Path(out_dir) / "summary.json").write_text(json.dumps(doc, indent=2, default=str))

