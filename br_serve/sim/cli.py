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


def _coef(name: str, text: str) -> float | tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in _csv(text))
    except ValueError:
        raise ValueError(f"--{name}: expected a number or a comma list, got {text!r}") from None
    if not vals:
        raise ValueError(f"--{name}: empty")
    return vals[0] if len(vals) == 1 else vals


def _drift(text: str) -> tuple[int, int, float]:
    """``"G@STEPxF"`` -> ``(G, STEP, F)``."""
    try:
        g, rest = text.split("@", 1)
        step, factor = rest.split("x", 1)
        return int(g), int(step), float(factor)
    except ValueError:
        raise ValueError(f"--step-drift: expected REPLICA@STEPxFACTOR, e.g. 3@5000x2.0, "
                         f"got {text!r}") from None


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
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the request rate)")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed lines (counted)")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Policies, cluster and cost model (shared by ``sim`` and ``capacity``)."""
    p.add_argument("--policies", default="jsq,br0", help="comma list; brh:NAME pins a predictor")
    p.add_argument("--replicas", default="8", help="G, or a comma list")
    p.add_argument("--slots", type=int, default=16, help="B: requests per replica")
    p.add_argument("--horizon", type=int, default=None,
                   help="shorthand for --policy-option horizon=H (policies with a horizon)")
    p.add_argument("--predictor", default=None,
                   help="predictor(s) for brh, comma list (survival, exact, oracle, ...)")
    p.add_argument("--predictor-model", default=None, help="model file for 'learned'")
    p.add_argument("--warm-start", default=None, metavar="TRACE",
                   help="feed this (earlier) trace to each predictor as finished history")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-limit", type=int, default=None, help="KV tokens per replica")
    p.add_argument("--pool-capacity", type=int, default=65536)
    p.add_argument("--prefill-replicas", type=int, default=8,
                   help="prefill servers (trace-timed mode)")
    p.add_argument("--prefill-p0-s", type=float, default=0.02)
    p.add_argument("--prefill-p1-s", type=float, default=2e-5, help="seconds per prompt token")
    p.add_argument("--step-a", default="5e-7",
                   help="s per KV token; one value, or one per replica (comma list)")
    p.add_argument("--step-b", default="0.03",
                   help="s per step; one value, or one per replica (comma list)")
    p.add_argument("--step-drift", action="append", default=[], metavar="G@STEPxF",
                   help="replica G's steps take F times as long from decode step STEP on "
                   "(repeatable), e.g. 3@5000x2.0")
    p.add_argument("--step-noise-cv", type=float, default=0.0,
                   help="per-step lognormal noise on each replica's step time (CV)")
    p.add_argument("--step-c", default="0",
                   help="s per running request; one value, or one per replica (comma list)")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option (repeatable): KEY for every listed policy that has "
                   "it, POLICY.KEY for one, e.g. r_max=4 or brh.gamma=0.97")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="decode-rank scheduling (repeatable): KEY for every run, ENTRY.KEY "
                   "for one --policies entry (a policy or a LABEL=POLICY variant), e.g. "
                   "jsq-dl.dyntralb_bubble_threshold_blocks=5 (docs/simulator.md)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument("--out", required=True, help="output directory")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from br_serve.sim.ensemble_cli import add_ensemble_args

    p = sub.add_parser("sim", help="simulate policies on a trace (deterministic)",
                       description=__doc__)
    add_trace_args(p)
    add_cluster_args(p)
    p.add_argument("--saturated", action="store_true", help="all requests at t=0")
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
                       start_s=args.start_s, end_s=args.end_s, time_scale=args.time_scale,
                       skip_bad=args.skip_bad)
    if len(trace) == 0:
        raise ValueError(f"--trace: no requests left in {args.trace} after the filters")
    if trace.skipped_lines:
        print(f"{args.command}: skipped {trace.skipped_lines} malformed line(s) in "
              f"{args.trace}", file=sys.stderr)
    return trace


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
    from br_serve.sim.runner import RunSpec

    options = parse_key_values(args.policy_option)
    if args.horizon is not None:
        options.setdefault("horizon", str(args.horizon))
    preds = _csv(args.predictor) if args.predictor else [None]
    runs = plan_policy_runs(_csv(args.policies), options, preds)
    engine = _engine_options(args, [r.variant or r.policy for r in runs])
    return [RunSpec(_config(args, saturated, run, g, engine.get(run.variant or run.policy,
                                                                {})),
                    run.label if run.variant else "")
            for g in _ints("replicas", args.replicas) for run in runs]


def _engine_options(args: argparse.Namespace, entries: list[str]) -> dict[str, dict[str, Any]]:
    """``--engine-option`` per entry key; refuses unknown fields and entries by name."""
    from br_serve.config.plan import parse_key_values
    from br_serve.sim.config import ENGINE_FIELDS

    out: dict[str, dict[str, Any]] = {e: {} for e in entries}
    for key, value in parse_key_values(args.engine_option, "--engine-option").items():
        entry, dot, field = key.rpartition(".")
        if field not in ENGINE_FIELDS:
            raise ValueError(f"--engine-option: {field!r} is not an engine option (known: "
                             f"{', '.join(sorted(ENGINE_FIELDS))})")
        if dot and entry not in out:
            raise ValueError(f"--engine-option: {key!r} names no --policies entry (entries: "
                             f"{', '.join(dict.fromkeys(entries))})")
        for e in ([entry] if dot else list(out)):
            out[e][field] = value
    return out


def _config(args: argparse.Namespace, saturated: bool, run: Any, g: int,
            engine: dict[str, Any]) -> SimConfig:
    from br_serve.sim.config import parse_sim_config

    return parse_sim_config(
        policy=run.policy, policy_options=run.options, predictor=run.predictor,
        predictor_model_path=args.predictor_model,
        replicas=g, slots=args.slots, kv_limit_tokens=args.kv_limit,
        seed=args.seed, saturated=saturated,
        step_a_s_per_token=_coef("step-a", args.step_a),
        step_b_s=_coef("step-b", args.step_b),
        step_c_s_per_request=_coef("step-c", args.step_c),
        step_drift=tuple(_drift(d) for d in args.step_drift),
        step_noise_cv=args.step_noise_cv,
        prefill_replicas=args.prefill_replicas,
        prefill_p0_s=args.prefill_p0_s, prefill_p1_s_per_token=args.prefill_p1_s,
        pool_capacity=args.pool_capacity, **engine)


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
    saturated = args.saturated or bool(args.stationary)
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
