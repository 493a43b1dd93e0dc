"""Generate docs/results.md: every policy at G = 4, 8, 16 on two real traces, both modes.

Usage (from the repository root; ~15-25 min on 2 shared cores)::

    python benchmarks/results.py [--requests 2000] [--replicas 4,8,16]
        [--json benchmarks/out/results.json] [--md docs/results.md] [--from-json]

Workloads (read from ../shared/traces, never copied):
- ServeGen DeepSeek-R1 (outputs > 1000 tokens), the closest public stand-in for the
  paper's heavy-tailed production trace;
- Mooncake conversation (long prompts, prefix hashes).
Each run simulates ``--requests`` requests taken *after* a training part of the same
trace: the learned predictor is trained on that earlier part (``br-serve
train-predictor``) and survival / exact are warm-started from it, so no predictor sees
the requests it is judged on. Saturated mode puts every request at t = 0; trace-timed
mode keeps the trace's arrival pattern, time-scaled so the offered token rate is 90%
of what JSQ sustains saturated at that G (the raw traces overload these clusters).
``--from-json`` re-renders the Markdown from an earlier JSON without simulating.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.sim import SimConfig, simulate
from br_serve.traces import Trace, load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_render import render

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
WORKLOADS: dict[str, dict[str, Any]] = {
    "servegen-r1": dict(path=TRACES / "servegen" / "deepseek_r1_5rps_1h.csv", min_output=1001,
                        train=6000),
    "mooncake-conv": dict(path=TRACES / "mooncake" / "conversation_trace.jsonl",
                          min_output=None, train=7000),
    # ServeGen draws inputs and outputs from one uniform number, so they are
    # rank-correlated; this variant permutes outputs (seeded) to remove that. G=8 only,
    # no learned model (to keep the script's run time down).
    "servegen-r1-shuffled": dict(path=TRACES / "servegen" / "deepseek_r1_5rps_1h.csv",
                                 min_output=1001, train=6000, shuffle_outputs=True,
                                 replicas=[8], learned=False),
}
BASELINES = ["random", "round_robin", "jsq", "p2c", "sglang_total_tokens", "vllm_dp",
             "dynamo_decode", "min_max", "br0"]
PREDICTORS = ["survives", "survival", "exact", "learned", "oracle"]
NO_AGEING = {"max_wait_ticks": 1_000_000, "max_wait_s": 1e9}


def _commit() -> str:
    """HEAD, marked '+dirty' when the core, predictors or simulator have local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "br_serve/core",
                                "br_serve/sim", "predictors"], capture_output=True,
                               text=True).stdout.strip()
    except OSError:
        return "?"
    return head + ("+dirty" if dirty else "")


def _write_jsonl(trace: Trace, path: Path) -> None:
    with path.open("w") as fh:
        for i in range(len(trace)):
            row: dict[str, Any] = {"arrival_s": float(trace.arrival_s[i]),
                                   "input_tokens": int(trace.input_tokens[i]),
                                   "output_tokens": int(trace.output_tokens[i])}
            if trace.hash_ids is not None:
                row["hash_ids"] = list(trace.hash_ids[i])
            fh.write(json.dumps(row) + "\n")


def _train_learned(train: Trace, tmp: Path, name: str) -> Path | None:
    data = tmp / f"{name}_train.jsonl"
    _write_jsonl(train, data)
    model = tmp / f"{name}_learned.safetensors"
    cmd = [sys.executable, "-m", "br_serve.cli", "train-predictor", "--trace", str(data),
           "--out", str(model), "--train-frac", "0.9"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    print(f"[{name}] train-predictor: rc {proc.returncode} in {time.perf_counter() - t0:.0f} s"
          f" {proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip()[-300:]}",
          flush=True)
    return model if proc.returncode == 0 and model.exists() else None


def _predictor(name: str, horizon: int, model: Path | None, train: Trace, seed: int) -> Any:
    from predictors import make_predictor, warm_start

    pred = make_predictor(name, horizon=horizon, seed=seed,
                          model_path=str(model) if name == "learned" and model else None)
    if name in ("survival", "exact"):
        warm_start(pred, train.input_tokens, train.output_tokens, hash_ids=train.hash_ids)
    return pred


def _plan(learned_ok: bool) -> list[tuple[str, str | None, str]]:
    """(policy, predictor, variant): shipped defaults, then BR with ageing off."""
    preds = [p for p in PREDICTORS if p != "learned" or learned_ok]
    rows: list[tuple[str, str | None, str]] = [(p, None, "default") for p in BASELINES]
    rows += [("brh", p, "default") for p in preds]
    rows += [("br0", None, "no-ageing")] + [("brh", p, "no-ageing") for p in preds]
    return rows


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    doc: dict[str, Any] = {"config": vars(args) | {"json": str(args.json), "md": str(args.md)},
                           "workloads": {}, "runs": [], "commit": _commit()}
    tmp = Path(tempfile.mkdtemp(prefix="br_results_"))
    for wname, spec in WORKLOADS.items():
        full = load_trace(spec["path"], min_output=spec["min_output"])
        if spec.get("shuffle_outputs"):
            perm = np.random.default_rng(args.seed).permutation(len(full))
            full = Trace.build(full.arrival_s, full.input_tokens, full.output_tokens[perm],
                               full.hash_ids, source=full.source + ":shuffled-outputs")
        k = int(spec["train"])
        train = full.take(np.arange(k))
        sim = full.take(np.arange(k, min(len(full), k + args.requests)))
        learn = not args.no_learned and spec.get("learned", True)
        model = _train_learned(train, tmp, wname) if learn else None
        doc["workloads"][wname] = {
            "path": str(spec["path"]), "filter_min_output": spec["min_output"],
            "train_requests": k, "sim_requests": len(sim), "learned_model": model is not None,
            "learned_planned": learn,
            "sim_duration_s": sim.duration_s, "replicas": spec.get("replicas", args.replicas),
            "shuffled_outputs": bool(spec.get("shuffle_outputs")),
            "offered_tok_s": float(sim.output_tokens.sum() / max(sim.duration_s, 1e-9)),
            "input_p50": float(np.median(sim.input_tokens)),
            "output_p50": float(np.median(sim.output_tokens)),
            "output_mean": float(sim.output_tokens.mean())}
        for g in spec.get("replicas", args.replicas):
            jsq_sat = None
            for mode in ("saturated", "trace"):
                trace = sim
                scale = 1.0
                if mode == "trace":
                    assert jsq_sat
                    offered = sim.output_tokens.sum() / sim.duration_s
                    scale = float(offered / (0.9 * jsq_sat))
                    trace = sim.scaled(scale)
                for pol, pred_name, variant in _plan(model is not None):
                    opts = dict(NO_AGEING) if variant == "no-ageing" else {}
                    if pol == "brh":
                        opts["horizon"] = args.horizon
                    cfg = SimConfig(policy=pol, predictor=pred_name, replicas=g,
                                    slots=args.slots, seed=args.seed, policy_options=opts,
                                    saturated=mode == "saturated")
                    pred = (_predictor(pred_name, args.horizon, model, train, args.seed)
                            if pred_name else None)
                    res = simulate(trace, cfg, predictor=pred)
                    s = res.summary()
                    s.update(workload=wname, variant=variant, time_scale=scale)
                    s["label"] = cfg.label
                    doc["runs"].append(s)
                    if pol == "jsq" and mode == "saturated":
                        jsq_sat = s["throughput_tok_s"]
                    print(f"[{wname} G={g} {mode}] {cfg.label:<14} {variant:<9} imb "
                          f"{s['mean_imbalance_tokens'] or 0:>11,.0f} thr "
                          f"{s['throughput_tok_s'] or 0:>8,.1f} bound "
                          f"{s['balanced_bound_tok_s'] or 0:>8,.1f} "
                          f"tick p50 {s['tick_p50_us'] or 0:>7,.0f} us "
                          f"({s['wall_s']:.1f} s)", flush=True)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--replicas", type=lambda t: [int(x) for x in t.split(",")],
                    default=[4, 8, 16])
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--horizon", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=Path("benchmarks/out/results.json"))
    ap.add_argument("--md", type=Path, default=Path("docs/results.md"))
    ap.add_argument("--from-json", action="store_true")
    ap.add_argument("--no-learned", action="store_true", help="skip training (quick check)")
    args = ap.parse_args()
    if args.from_json:
        doc = json.loads(args.json.read_text())
    else:
        t0 = time.perf_counter()
        doc = run_all(args)
        doc["wall_s"] = time.perf_counter() - t0
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(render(doc))
    print(f"wrote {args.md} ({len(doc['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
