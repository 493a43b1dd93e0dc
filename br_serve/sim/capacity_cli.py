"""``br-serve capacity``: the highest request rate each policy carries within a latency SLO.

For every planned configuration (``--policies`` x ``--replicas``, trace-timed), a
bisection over the arrival-rate scale finds the highest rate at which the ensemble means
(over ``--replays`` paired replays) of TPOT P95 and TTFT P95 meet
``--slo-tpot-p95-ms`` and ``--slo-ttft-p95-s`` (see :mod:`br_serve.sim.capacity` for the
search and its bracket). Writes ``capacity.json`` (``{"runs": [...], "slo": ...}``),
``capacity.md`` and ``plots/capacity_G<g>.png`` under ``--out``; ``--json`` also prints
the JSON object on stdout (instead of the table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from br_serve.sim.cli import add_cluster_args, add_trace_args
    from br_serve.sim.ensemble_cli import add_ensemble_args

    p = sub.add_parser("capacity", help="capacity at a latency SLO, per policy (simulated)",
                       description=__doc__)
    add_trace_args(p)
    add_cluster_args(p, skip=("sim.saturated",))
    p.add_argument("--slo-tpot-p95-ms", type=float, required=True,
                   help="TPOT P95 objective (ms), on the ensemble mean")
    p.add_argument("--slo-ttft-p95-s", type=float, required=True,
                   help="TTFT P95 objective (s), on the ensemble mean")
    p.add_argument("--rate-lo-req-s", type=float, default=None,
                   help="bracket bottom (default: the top / --rate-lo-fraction)")
    p.add_argument("--rate-hi-req-s", type=float, default=None,
                   help="bracket top (default: G x B / min(b) / mean output, a rate no "
                   "policy can exceed)")
    p.add_argument("--rate-lo-fraction", type=float, default=16.0,
                   help="default bottom = top / this")
    p.add_argument("--rate-tol", type=float, default=0.02,
                   help="stop when top / bottom - 1 <= this (the answer's resolution)")
    p.add_argument("--per-replay", action="store_true",
                   help="search each replay window on its own and compare policies by "
                   "the paired per-window capacity ratios, with a 95%% interval "
                   "(br_serve.sim.capacity_paired); the reported capacity is the mean "
                   "over windows")
    p.add_argument("--json", action="store_true", help="print the JSON object on stdout")
    add_ensemble_args(p, capacity=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from br_serve.sim.capacity import SLO, Bracket, capacity
    from br_serve.sim.capacity_paired import paired_capacity
    from br_serve.sim.cli import cluster_specs, load_cli_trace, trace_meta
    from br_serve.sim.ensemble_cli import replay_mode
    from br_serve.sim.ensemble_output import capacity_table, plot_capacity
    from br_serve.sim.runner import default_jobs
    from br_serve.traces import load_trace

    slo = SLO(tpot_p95_ms=args.slo_tpot_p95_ms, ttft_p95_s=args.slo_ttft_p95_s)
    bracket = Bracket(lo_req_s=args.rate_lo_req_s, hi_req_s=args.rate_hi_req_s,
                      lo_fraction=args.rate_lo_fraction, rel_tol=args.rate_tol)
    mode = replay_mode(args, saturated=False)
    if mode == "window" and args.limit is None:
        raise ValueError("--limit: --replay-mode window needs the window length")
    trace = load_cli_trace(args, limit=mode != "window")
    history = load_trace(args.warm_start, skip_bad=args.skip_bad) if args.warm_start else None
    specs = cluster_specs(args, saturated=False)
    replays = 8 if args.replays is None else args.replays
    t0 = time.perf_counter()
    say = (lambda m: print(f"capacity: {m}", file=sys.stderr, flush=True)) if args.progress \
        else None
    search = paired_capacity if args.per_replay else capacity
    res = search(trace, specs, slo, replays=replays, replay_mode=mode,
                 limit=args.limit if mode == "window" else None, jitter_ms=args.jitter_ms,
                 seed=specs[0].config.seed, baseline=args.baseline, bracket=bracket,
                 warm_start=history,
                 jobs=default_jobs() if args.jobs is None else args.jobs, progress=say)
    doc = {**res.to_dict(), **trace_meta(args, trace), "wall_s": time.perf_counter() - t0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, default=str)
    (out / "capacity.json").write_text(text)
    (out / "capacity.md").write_text(capacity_table(res.runs))
    if not args.no_plots:
        for g in sorted({r["replicas"] for r in res.runs}):
            plot_capacity([r for r in res.runs if r["replicas"] == g],
                          out / "plots" / f"capacity_G{g}.png",
                          f"G={g}: capacity at TPOT P95 <= {slo.tpot_p95_ms:g} ms, "
                          f"TTFT P95 <= {slo.ttft_p95_s:g} s")
    if args.json:
        print(text)
    else:
        print(capacity_table(res.runs), end="")
    for r in res.runs:
        if not r["met"] or r["capped"]:
            print(f"capacity: {r['label']} G={r['replicas']}: {r['note']}", file=sys.stderr)
    print(f"capacity: wrote {out}/capacity.json, capacity.md"
          f"{'' if args.no_plots else ', plots/'} in {doc['wall_s']:.1f} s", file=sys.stderr)
    return 0
