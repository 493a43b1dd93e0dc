"""``br-serve train-predictor`` and ``br-serve eval-predictor``.

Both read a trace with ``br_serve.traces.load_trace`` and use the time-ordered split of
:mod:`predictors.train`. Bad input (unknown predictor, missing or corrupted model file,
a trace without the needed fields) raises ``ValueError``/``FileNotFoundError`` whose
message names the problem; the ``br-serve`` dispatcher prints it on one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="trace file (any format load_trace reads)")
    p.add_argument("--format", default="auto", help="trace format (default: detect)")
    p.add_argument("--limit", type=int, default=None, help="use the first N requests")
    p.add_argument("--policy", default="brh",
                   help="the policy whose look-ahead the predictor serves (default brh)")
    p.add_argument("--horizon", type=int, default=None,
                   help="window H in decode steps (default: the horizon option's default "
                   "of --policy)")
    p.add_argument("--step-s", type=float, default=0.08,
                   help="seconds per decode step in the replay (default 0.08)")
    p.add_argument("--train-frac", type=float, default=0.7,
                   help="share of requests (by arrival) in the training part")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers: Any) -> None:
    tr = subparsers.add_parser("train-predictor", help="train the learned predictor",
                               description=_train.__doc__)
    _common(tr)
    tr.add_argument("--out", required=True, help="model file to write (safetensors)")
    tr.add_argument("--epochs", type=int, default=12)
    tr.add_argument("--hidden", type=int, default=32)
    tr.set_defaults(func=_train)
    ev = subparsers.add_parser("eval-predictor", help="AUC/Brier/ECE of predictors",
                               description=_eval.__doc__)
    _common(ev)
    ev.add_argument("--predictor", required=True,
                    help="name, or comma-separated names (survival,exact,learned,...)")
    ev.add_argument("--predictor-model-path", default=None,
                    help="model file for the learned predictor")
    ev.add_argument("--out", default=None, help="also write the JSON to this file")
    ev.set_defaults(func=_eval)


def _load(args: argparse.Namespace) -> Any:
    from br_serve.traces import load_trace
    from predictors.replay import check_trace

    if args.horizon is None:
        from br_serve.core import parse_policy_options, predictor_horizon

        args.horizon = predictor_horizon(args.policy, parse_policy_options(args.policy))
        if args.horizon is None:
            raise ValueError(f"--policy: {args.policy!r} uses no predictor; give --horizon")
    if args.horizon < 1:
        raise ValueError(f"--horizon: must be >= 1 (got {args.horizon})")
    if not Path(args.trace).is_file():
        raise FileNotFoundError(f"--trace: no such file {args.trace!r}")
    trace = load_trace(args.trace, args.format, limit=args.limit)
    check_trace(trace, args.trace)
    return trace


def _train(args: argparse.Namespace) -> int:
    """Train the two-head learned predictor on the training part of a trace."""
    from predictors.train import FitOptions, train_on_trace

    if args.epochs < 1 or args.hidden < 1:
        raise ValueError("--epochs and --hidden: must be >= 1")
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        raise FileNotFoundError(f"--out: directory {str(out.parent)!r} does not exist")
    trace = _load(args)
    opts = FitOptions(hidden=args.hidden, epochs=args.epochs, seed=args.seed)
    model, split = train_on_trace(trace, args.horizon, step_s=args.step_s,
                                  train_frac=args.train_frac, opts=opts)
    model.save(out)
    info = {"out": str(out), "trace": args.trace, "horizon": args.horizon,
            "train_requests": split.n_train_requests, "split_s": split.split_s,
            "calib_a": model.calib_a, "calib_b": model.calib_b, **(model.train_info or {})}
    if args.json:
        print(json.dumps(info))
    else:
        print(f"wrote {out}: H={args.horizon}, {info['n_fit']} fit + "
              f"{info['n_calibration']} calibration samples from the first "
              f"{split.n_train_requests} requests (split at {split.split_s:.1f} s)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    """Replay a trace and report AUC, Brier, ECE, mu_rem MAE per predictor (test part)."""
    from predictors import predictor_names
    from predictors.evaluate import evaluate

    names = [n.strip() for n in args.predictor.split(",") if n.strip()]
    for n in names:
        if n not in predictor_names():
            raise ValueError(f"--predictor: unknown predictor {n!r}; known: "
                             f"{', '.join(predictor_names())}")
    path = args.predictor_model_path
    if "learned" in names and not path:
        raise ValueError("--predictor-model-path: the learned predictor needs a model file "
                         "(br-serve train-predictor --out FILE)")
    if path and not Path(path).is_file():
        raise FileNotFoundError(f"--predictor-model-path: no such file {path!r}")
    trace = _load(args)
    rows = evaluate(trace, names, args.horizon, step_s=args.step_s,
                    train_frac=args.train_frac, model_path=path, seed=args.seed,
                    source=args.trace)
    for r in rows:
        r["trace"] = args.trace
    doc: Any = rows[0] if len(rows) == 1 else {"runs": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"trace {args.trace}, H={args.horizon}, test samples {rows[0]['n_samples']} "
          f"(positive rate {rows[0]['positive_rate']:.3f})")
    print(f"{'predictor':<10} {'auc':>7} {'brier':>7} {'ece':>7} {'mu_mae':>8}")
    for r in rows:
        print(f"{r['predictor']:<10} {r['auc']:7.4f} {r['brier']:7.4f} {r['ece']:7.4f} "
              f"{r['mu_rem_mae']:8.2f}")
    sys.stdout.flush()
    return 0
