"""``br-serve sim``: replay a trace through the simulator under several policies.

Every combination of ``--policies`` x ``--replicas`` (and, for a policy that uses a
predictor, each name in ``--predictor``) is one run; all runs share the trace, seed and
cluster parameters. A policy entry ``brh:NAME`` pins that run's predictor; a policy may
be a qualified name (``package.module.Class``) of a policy outside this package.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from br_serve.sim.config import SimConfig
    from br_serve.sim.runner import RunSpec
    from br_serve.traces import Trace


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(name: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in _csv(text)]
    except ValueError:
        raise ValueError(f"--{name}: expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise ValueError(f"--{name}: empty")
    return vals


def add_trace_args(p: argparse.ArgumentParser) -> None:
    """Trace file and filters (shared by ``sim`` and ``capacity``)."""
    p.add_argument("--trace", required=True, help="trace file")
    p.add_argument("--format", default="auto",
                   choices=["auto", "azure", "mooncake", "servegen", "burstgpt", "jsonl"])
    p.add_argument("--limit", type=int, default=None,
                   help="first N requests (after filters); with --replay-mode window, the "
                   "window length")
    p.add_argument("--min-output", type=int, default=None)
    p.add_argument("--max-output", type=int, default=None)
    p.add_argument("--start-s", type=float, default=None)
    p.add_argument("--end-s", type=float, default=None)
    p.add_argument("--arrival-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the request rate)")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed lines (counted)")


def add_cluster_args(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Policies, cluster and cost model (shared by ``sim`` and ``capacity``): the sweep
    (``--policies``, ``--replicas``, ``--predictor``) and one flag per other
    :class:`~br_serve.sim.config.SimConfig` field, named by its path (``--step-b-s`` for
    ``step.b_s``, ``--sim-saturated`` for ``sim.saturated``); ``skip``: paths left out."""
    from br_serve.config.tree import add_flags
    from br_serve.sim.config import SimConfig

    p.add_argument("--policies", default="jsq,br0", help="comma list; brh:NAME pins a predictor")
    p.add_argument("--replicas", default="8", help="G, or a comma list (one run per value)")
    p.add_argument("--predictor", default=None,
                   help="predictor(s) for brh, comma list (survival, exact, oracle, ...)")
    p.add_argument("--warm-start", default=None, metavar="TRACE",
                   help="feed this (earlier) trace to each predictor as finished history")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option (repeatable): KEY for every listed policy that has "
                   "it, POLICY.KEY for one, e.g. r_max=4 or brh.gamma=0.97")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="decode-rank scheduling (repeatable): KEY for every run, ENTRY.KEY "
                   "for one --policies entry (a policy or a LABEL=POLICY variant), e.g. "
                   "jsq-dl.dyntralb_bubble_threshold_blocks=5 (docs/simulator.md)")
    add_flags(p, SimConfig, skip=("replicas", "policy", "predictor.name",
                                  *skip))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument("--out", required=True, help="output directory")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from br_serve.sim.ensemble_cli import add_ensemble_args

    p = sub.add_parser("sim", help="simulate policies on a trace (deterministic)",
                       description=__doc__)
    add_trace_args(p)
    add_cluster_args(p)
    p.add_argument("--series-max-rows", type=int, default=200_000)
    add_ensemble_args(p)
    p.set_defaults(func=run)

    f = sub.add_parser("fetch-trace", help="download a public trace (needs internet)",
                       description="Download the public original of a supported trace into "
                       "DEST/<family>/<original file name>, e.g. traces/mooncake/"
                       "conversation_trace.jsonl; without NAME, list the sources and "
                       "where each one goes.")
    f.add_argument("name", nargs="?", default=None, help="source name (omit to list them)")
    f.add_argument("--dest", default="traces", help="directory to write into")
    f.add_argument("--force", action="store_true", help="download again if present")
    f.set_defaults(func=fetch)


def fetch(args: argparse.Namespace) -> int:
    from br_serve.traces.download import SOURCES, DownloadError, download, target

    if args.name is None:
        for s in SOURCES:
            print(f"{s.name:<24} {target(s.name, args.dest)!s:<52} {s.licence}")
        return 0
    try:
        print(f"fetch-trace: wrote {download(args.name, args.dest, force=args.force)}")
    except DownloadError as exc:  # one line, no traceback (offline is not a bug)
        print(f"br-serve fetch-trace: error: {exc}", file=sys.stderr)
        return 1
    return 0


def load_cli_trace(args: argparse.Namespace, limit: bool = True) -> Trace:
    """The filtered trace (``limit``: apply ``--limit`` as "first N")."""
    from br_serve.traces import load_trace

    trace = load_trace(args.trace, args.format, limit=args.limit if limit else None,
                       min_output=args.min_output, max_output=args.max_output,
                       start_s=args.start_s, end_s=args.end_s, arrival_scale=args.arrival_scale,
                       skip_bad=args.skip_bad)
    if len(trace) == 0:
        raise ValueError(f"--trace: no requests left in {args.trace} after the filters")
    if trace.skipped_lines:
        print(f"{args.command}: skipped {trace.skipped_lines} malformed line(s) in "
              f"{args.trace}", file=sys.stderr)
    return trace


def saturated_flag(args: argparse.Namespace) -> bool:
    """Whether ``--sim-saturated`` was given."""
    from br_serve.config.tree import given_flags

    return str(given_flags(args).get("sim.saturated", False)).lower() in ("true", "1")


def cluster_configs(args: argparse.Namespace, saturated: bool) -> list[SimConfig]:
    """One validated config per planned (policy, predictor) x ``--replicas``."""
    specs = cluster_specs(args, saturated)
    named = [s.label for s in specs if s.label]
    if named:  # a SimConfig is labelled by its policy: two variants would collide
        raise ValueError(f"--policies: named variants ({', '.join(dict.fromkeys(named))}) "
                         "need --replays (an ensemble), or run each separately")
    return [s.config for s in specs]


def cluster_specs(args: argparse.Namespace, saturated: bool) -> list[RunSpec]:
    """One labelled run per planned (policy entry, predictor) x ``--replicas``; a
    ``LABEL=POLICY`` entry's runs carry ``LABEL`` (``LABEL+PREDICTOR``)."""
    from br_serve.config.plan import parse_key_values, plan_policy_runs
    from br_serve.config.tree import given_flags
    from br_serve.sim.config import parse_sim_config
    from br_serve.sim.runner import RunSpec

    options = parse_key_values(args.policy_option)
    preds = _csv(args.predictor) if args.predictor else [None]
    runs = plan_policy_runs(_csv(args.policies), options, preds)
    engine = _engine_options(args, [r.variant or r.policy for r in runs])
    given = given_flags(args)
    if saturated:
        given["sim.saturated"] = True
    # the predictor's own flags go to the runs that have a predictor
    shared = {k: v for k, v in given.items() if not k.startswith("predictor.")}
    return [RunSpec(parse_sim_config(given if run.predictor else shared, replicas=g,
                                     policy=run.policy, policy_options=run.options,
                                     predictor=run.predictor,
                                     **engine[run.variant or run.policy]),
                    run.label if run.variant else "")
            for g in _ints("replicas", args.replicas) for run in runs]


def _engine_options(args: argparse.Namespace, entries: list[str]) -> dict[str, dict[str, Any]]:
    """``--engine-option`` per entry key (flat names, e.g. ``dyntralb_mode``); refuses
    unknown fields and entries by name."""
    from br_serve.config.plan import parse_key_values
    from br_serve.config.tree import leaves
    from br_serve.sim.config import ENGINE_FIELDS, SimConfig

    known = {"_".join(leaf.path) for leaf in leaves(SimConfig)
             if leaf.path[0] in ENGINE_FIELDS}
    out: dict[str, dict[str, Any]] = {e: {} for e in entries}
    for key, value in parse_key_values(args.engine_option, "--engine-option").items():
        entry, dot, field = key.rpartition(".")
        if field not in known:
            raise ValueError(f"--engine-option: {field!r} is not an engine option (known: "
                             f"{', '.join(sorted(known))})")
        if dot and entry not in out:
            raise ValueError(f"--engine-option: {key!r} names no --policies entry (entries: "
                             f"{', '.join(dict.fromkeys(entries))})")
        for e in ([entry] if dot else list(out)):
            out[e][field] = value
    return out


def trace_meta(args: argparse.Namespace, trace: Trace) -> dict[str, Any]:
    return {"trace": {"path": str(args.trace), "source": trace.source,
                      "requests": len(trace), "skipped_lines": trace.skipped_lines,
                      "dropped_rows": trace.dropped_rows},
            "argv": sys.argv[1:]}


def run(args: argparse.Namespace) -> int:
    from br_serve.sim.engine import simulate
    from br_serve.sim.ensemble_cli import (
        replay_mode,
        run_sim_ensemble,
        single_replay_ensemble,
        wants_ensemble,
    )
    from br_serve.sim.output import write_outputs
    from br_serve.sim.predict import build_predictor, warm_start_from
    from br_serve.traces import load_trace

    ensemble = wants_ensemble(args)
    saturated = saturated_flag(args) or bool(args.stationary)
    windows = ensemble and replay_mode(args, saturated) == "window"
    trace = load_cli_trace(args, limit=not windows)
    history = load_trace(args.warm_start, skip_bad=args.skip_bad) if args.warm_start else None
    if ensemble:
        return run_sim_ensemble(args, trace, cluster_specs(args, saturated), history,
                                trace_meta(args, trace))
    configs = cluster_configs(args, saturated)
    results = []
    for cfg in configs:
        t0 = time.perf_counter()
        predictor = build_predictor(cfg)
        if predictor is not None and history is not None:
            warm_start_from(predictor, history)
        res = simulate(trace, cfg, predictor=predictor, progress=args.progress)
        s = res.summary()
        print(f"{cfg.label:>24} G={cfg.replicas:<3} imbalance "
              f"{s['mean_imbalance_tokens'] or 0:>12,.0f} "
              f"thr {s['throughput_tok_s'] or 0:>9,.1f} tok/s (bound "
              f"{s['balanced_bound_tok_s'] or 0:,.1f}) TPOT p95 {s['tpot_p95_ms'] or 0:.1f} ms "
              f"| {s['steps']} steps in {time.perf_counter() - t0:.1f} s", flush=True)
        results.append(res)
    doc = write_outputs(results, args.out, meta=trace_meta(args, trace),
                        max_rows=args.series_max_rows, plots=not args.no_plots)
    single_replay_ensemble(doc, trace, configs, args.baseline, args.out)
    print(f"sim: wrote {args.out}/summary.json, results.md, series/, loads/"
          f"{'' if args.no_plots else ', plots/'}")
    return 0
