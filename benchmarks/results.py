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
                           "workloads": {}, "runs": []}
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
                    cfg = SimConfig(policy=pol, predictor=pred_name, replicas=g,
                                    slots=args.slots, horizon=args.horizon, seed=args.seed,
                                    saturated=mode == "saturated")
                    pred = (_predictor(pred_name, args.horizon, model, train, args.seed)
                            if pred_name else None)
                    opts = dict(NO_AGEING) if variant == "no-ageing" else {}
                    res = simulate(trace, cfg, opts, predictor=pred)
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


# --- rendering ------------------------------------------------------------------------

PAPER = """| workload | policy | mean imbalance (tokens) | TPOT P95 ms | throughput tok/s |
|---|---|---|---|---|
| production | JSQ (best baseline) | 215,110 | 83.2 | 843 |
| production | BR-0 | 51,927 | 79.3 | 943 (+11.8%) |
| production | BR-H survival | 40,757 | 78.7 | 979 (+16.1%) |
| production | BR-H ExactMatch | 36,277 | 78.8 | 977 (+15.9%) |
| production | BR-H oracle | 23,577 | 78.0 | 1,029 (+22.1%) |
| Azure 2024 | JSQ | 104,737 | 89.3 | 785 |
| Azure 2024 | BR-0 | 54,051 | 83.3 | 854 (+8.8%) |
| Azure 2024 | BR-H ExactMatch | 38,496 | 82.3 | 909 (+15.8%) |
| Azure 2024 | BR-H oracle | 35,301 | 77.3 | 957 (+21.9%) |
"""
PAPER_SCALING = {4: ("+11.4%", "+13.7%"), 8: ("+11.8%", "+22.1%"), 16: ("+20.6%", "+34.6%")}


def _f(v: Any, d: int = 0) -> str:
    return "-" if v is None else f"{v:,.{d}f}"


def _key(r: dict[str, Any]) -> tuple[str, str, int]:
    return r["workload"], r["mode"], r["replicas"]


def _jsq(runs: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {_key(r): r for r in runs if r["policy"] == "jsq" and r["variant"] == "default"}


def _gain(r: dict[str, Any], base: dict[str, Any] | None) -> tuple[str, str]:
    if not base or not r["throughput_tok_s"] or not base["throughput_tok_s"]:
        return "-", "-"
    thr, b0, bound = r["throughput_tok_s"], base["throughput_tok_s"], r["balanced_bound_tok_s"]
    share = f"{100 * (thr - b0) / (bound - b0):.0f}%" if bound and bound > b0 else "-"
    return f"{100 * (thr / b0 - 1):+.1f}%", share


def _whole(r: dict[str, Any]) -> float | None:
    """Tokens per second over the whole run, drain included (idle excluded)."""
    busy = r["makespan_s"] if r["mode"] == "saturated" else None
    if busy is None:
        thr = r["throughput_tok_s"]  # trace mode: the headline already is the whole run
        return None if thr is None else float(thr)
    return float(r["tokens_generated"] / busy) if busy > 0 else None


def _table(runs: list[dict[str, Any]], jsq: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    out = ["| G | policy | ageing | mean imbalance | TPOT P50 / P95 ms | TTFT P95 s | "
           "throughput tok/s | vs JSQ | balanced bound | headroom share | whole run tok/s "
           "(vs JSQ) | tick P50 / P99 us |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        gain, share = _gain(r, jsq.get(_key(r)))
        ttft = None if r["ttft_p95_ms"] is None else r["ttft_p95_ms"] / 1e3
        whole = _whole(r)
        wbase = _whole(jsq[_key(r)]) if _key(r) in jsq else None
        wgain = f" ({100 * (whole / wbase - 1):+.1f}%)" if whole and wbase else ""
        out.append(
            f"| {r['replicas']} | {r['label']} | {'off' if r['variant'] == 'no-ageing' else 'on'}"
            f" | {_f(r['mean_imbalance_tokens'])} | {_f(r['tpot_p50_ms'], 1)} / "
            f"{_f(r['tpot_p95_ms'], 1)} | {_f(ttft, 1)} | {_f(r['throughput_tok_s'], 1)} | "
            f"{gain} | {_f(r['balanced_bound_tok_s'], 1)} | {share} | {_f(whole, 1)}{wgain} | "
            f"{_f(r['tick_p50_us'])} / {_f(r['tick_p99_us'])} |")
    return "\n".join(out) + "\n"


def _pick(runs: list[dict[str, Any]], wl: str, mode: str, g: int, label: str,
          variant: str) -> dict[str, Any] | None:
    for r in runs:
        if (_key(r) == (wl, mode, g) and r["label"] == label and r["variant"] == variant):
            return r
    return None


def _learned_cell(w: dict[str, Any]) -> str:
    if w["learned_model"]:
        return "trained on the training part"
    return "failed to train: omitted" if w.get("learned_planned", True) else "not run"


def _g(runs: list[dict[str, Any]], wl: str, mode: str, g: int, label: str, var: str,
       jsq: dict[tuple[str, str, int], dict[str, Any]], whole: bool = False) -> float | None:
    r, b = _pick(runs, wl, mode, g, label, var), jsq.get((wl, mode, g))
    if not r or not b:
        return None
    x, y = (_whole(r), _whole(b)) if whole else (r["throughput_tok_s"], b["throughput_tok_s"])
    return 100 * (x / y - 1) if x and y else None


def _p(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def discussion(doc: dict[str, Any]) -> str:
    """The deviations, with the numbers of this run (so the text cannot go stale)."""
    runs, jsq = doc["runs"], _jsq(doc["runs"])
    wls = [w for w in doc["workloads"] if 8 in doc["workloads"][w].get("replicas", [8])]
    out = ["## Reading these numbers: deviations from the paper, explained\n"]
    ag = "; ".join(f"{w}: {_p(_g(runs, w, 'saturated', 8, 'br0', 'default', jsq))} with "
                   f"ageing, {_p(_g(runs, w, 'saturated', 8, 'br0', 'no-ageing', jsq))} without"
                   for w in wls)
    out.append(
        "1. **Ageing decides the saturated results.** The core's default `max_wait` (2 s or "
        "32 ticks; the simulator counts a tick per decode step) is exceeded by *every* "
        "request of a saturated pool within 32 steps, so from then on BR's ageing pass "
        "assigns the pool in arrival order, each request to its best-F replica: BR-0 "
        "becomes an FCFS placement rule and lands near JSQ. With ageing switched off "
        "(`max_wait_ticks=1e6, max_wait_s=1e9`, rows marked 'off') BR chooses *which* "
        f"request goes where, as the paper describes. BR-0 vs JSQ at G=8 (steady window): "
        f"{ag}. This is a property of the core's defaults under saturation, not of the "
        "simulator; the 'off' rows are the closest to the policy the paper describes.\n")
    wh = "; ".join(f"{w}: window {_p(_g(runs, w, 'saturated', 8, 'br0', 'no-ageing', jsq))}, "
                   f"whole run {_p(_g(runs, w, 'saturated', 8, 'br0', 'no-ageing', jsq, True))}"
                   for w in wls)
    out.append(
        "2. **Steady window vs whole run.** DESIGN section 7 puts the headline on the steady "
        "window (until the pool first runs empty) and reports the drain apart. Without "
        "ageing BR can defer requests it cannot place well (large prompts) into the drain, "
        "which the window does not see, so the tables also give whole-run throughput "
        f"(window + drain). BR-0 without ageing at G=8: {wh}. On ServeGen the drain of the "
        "baselines is long (a few very long outputs decode almost alone at the end), which "
        "is why BR's whole-run gain there can exceed its window gain. ServeGen's inputs and "
        "outputs are rank-correlated (one uniform draw per request), so choosing by prompt "
        "also reorders by output length; `servegen-r1-shuffled` permutes the outputs to "
        "isolate the placement effect.\n")
    sv = [(r["label"], r["mean_imbalance_tokens"]) for r in runs
          if _key(r) == ("servegen-r1", "saturated", 8) and r["variant"] == "default"
          and r["policy"] == "brh"]
    same = sorted(lbl for lbl, v in sv if v == dict(sv).get("brh+survives"))
    out.append(
        "3. **The confidence gate rarely opens on heavy tails.** With H = 80 and outputs "
        "above 1000 tokens the empirical probability of finishing within the window stays "
        "far below the 0.5 gate for most running requests, so BR-H with a predictor makes "
        "the closed gate's decisions. On servegen-r1 at G=8 (ageing on) these BR-H rows have "
        f"exactly the closed gate's imbalance: {', '.join(same) or 'none'}. Mooncake's "
        "outputs are short (P50 ~350), the gate opens and the predictors differ. `learned` "
        "is trained with `br-serve train-predictor` on the training part (earlier requests "
        "of the same trace); `survival` and `exact` are warm-started from the same part and "
        "keep learning online; none sees the simulated requests beforehand.\n")
    o = _pick(runs, "mooncake-conv", "saturated", 8, "brh+oracle", "no-ageing")
    b = _pick(runs, "mooncake-conv", "saturated", 8, "br0", "no-ageing")
    if o and b:
        verdict = ("does not beat BR-0 here" if o["throughput_tok_s"] <= b["throughput_tok_s"]
                   else "beats BR-0 here")
        out.append(
            "4. **BR-H with the oracle is not an upper bound in these runs.** On "
            f"mooncake-conv, saturated, G=8, ageing off, BR-H+oracle {verdict}: mean "
            f"imbalance {_f(o['mean_imbalance_tokens'])} vs {_f(b['mean_imbalance_tokens'])}"
            f" tokens, {_f(o['throughput_tok_s'], 1)} vs {_f(b['throughput_tok_s'], 1)} "
            "tok/s. BR-H scores the whole projected window (gamma = 1, H = 80) while the "
            "metric is the barrier of each step; the paper's ordering (oracle > ExactMatch > "
            "survival > BR-0) is not reproduced and we do not claim it.\n")
    tr = [abs(_g(runs, r["workload"], "trace", r["replicas"], r["label"], r["variant"], jsq)
              or 0.0) for r in runs if r["mode"] == "trace"]
    out.append(
        "5. **Trace-timed runs barely separate the policies** (largest throughput gap to JSQ "
        f"in any trace-timed run: {max(tr, default=0):.1f}%). Arrival times are scaled so "
        "the offered tokens are 90% of JSQ's saturated throughput; the pool then holds one "
        "or a few requests per tick, and a router with one candidate has nothing to choose. "
        "The paper measured a saturated cluster; the differences that remain in trace mode "
        "are in the imbalance and the latency tails.\n")
    ticks = [r["tick_p50_us"] for r in runs if r["policy"] == "br0" and r["tick_p50_us"]]
    out.append(
        "6. **Absolute numbers** differ from the paper's: the cost model is DESIGN's linear "
        "step model with its defaults, B = 16, no KV limit; neither the paper's production "
        "trace nor Azure 2024 is available here. Mooncake's long prompts (P50 ~6.4k tokens) "
        "make imbalances several times the paper's. BR-0's tick P50 is "
        f"{_f(min(ticks, default=0))}-{_f(max(ticks, default=0))} us here (paper: 1.2 ms); "
        "BR-H with predictors costs more (the tables list P50 / P99), all measured on a "
        "shared 2-core machine.\n")
    return "\n".join(out)


def render(doc: dict[str, Any]) -> str:
    runs: list[dict[str, Any]] = doc["runs"]
    jsq = _jsq(runs)
    cfg = doc["config"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    parts = [
        "# Simulated results: every policy, G = 4 / 8 / 16, two public traces\n",
        "Generated by `python benchmarks/results.py` (this file is overwritten; do not edit "
        f"by hand). Commit `{commit}`; {len(runs)} runs in "
        f"{_f(doc.get('wall_s', 0) / 60, 1)} min on the 2-core development machine.\n",
        f"Cluster model: B = {cfg['slots']} slots per replica, no KV limit, step time "
        "`5e-7 s/token * max_g L_g + 0.03 s` (DESIGN section 2 defaults), BR-H horizon "
        f"H = {cfg['horizon']}, seed {cfg['seed']}. Prefill (trace-timed mode): 8 instances, "
        "`0.02 s + 2e-5 s/token`. Saturated headline metrics cover the steady window (until "
        "the pool first runs empty); trace-timed ones the whole run. Throughput is generated "
        "tokens per second of decode-busy time; the balanced bound is the same run with every "
        "step priced at the mean load (DESIGN section 7); headroom share is "
        "`(thr - thr_jsq) / (bound - thr_jsq)`.\n",
        "## Workloads\n",
        "| workload | simulated requests | training part (earlier requests) | input P50 | "
        "output P50 / mean | learned model |",
        "|---|---|---|---|---|---|",
    ]
    for wl, w in doc["workloads"].items():
        parts.append(f"| {wl} | {w['sim_requests']} | {w['train_requests']} | "
                     f"{_f(w['input_p50'])} | {_f(w['output_p50'])} / {_f(w['output_mean'])} | "
                     f"{_learned_cell(w)} |")
    parts += ["", "## The paper's numbers (DESIGN section 9; G = 8, Ascend 910C, "
              "DeepSeek-V3)\n", PAPER,
              "Paper's gains over JSQ by G (production trace), BR-0 / BR-H oracle: "
              + "; ".join(f"G={g}: {a} / {b}" for g, (a, b) in PAPER_SCALING.items()) + ".\n",
              "## Scaling summary: throughput gain over JSQ\n",
              "| workload | mode | G | paper BR-0 / oracle | br0 | br0 (ageing off) | "
              "best brh (ageing on) | best brh (ageing off) | brh+oracle (ageing off) | "
              "whole run: br0 (ageing off) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for wl in doc["workloads"]:
        for mode in ("saturated", "trace"):
            for g in doc["workloads"][wl].get("replicas", cfg["replicas"]):
                base = jsq.get((wl, mode, g))
                cells = []
                for label, var in (("br0", "default"), ("br0", "no-ageing")):
                    cells.append(_gain(_pick(runs, wl, mode, g, label, var) or {}, base)[0]
                                 if _pick(runs, wl, mode, g, label, var) else "-")
                for var in ("default", "no-ageing"):
                    brh = [r for r in runs if _key(r) == (wl, mode, g)
                           and r["policy"] == "brh" and r["variant"] == var
                           and r["predictor"] != "oracle"]
                    best = max(brh, key=lambda r: r["throughput_tok_s"] or 0, default=None)
                    cells.append(f"{_gain(best, base)[0]} ({best['predictor']})" if best
                                 else "-")
                orc = _pick(runs, wl, mode, g, "brh+oracle", "no-ageing")
                cells.append(_gain(orc, base)[0] if orc else "-")
                b0 = _pick(runs, wl, mode, g, "br0", "no-ageing")
                wb, wj = (_whole(b0) if b0 else None), (_whole(base) if base else None)
                cells.append(f"{100 * (wb / wj - 1):+.1f}%" if wb and wj else "-")
                pa = PAPER_SCALING.get(g, ("-", "-"))
                parts.append(f"| {wl} | {mode} | {g} | {pa[0]} / {pa[1]} | "
                             + " | ".join(cells) + " |")
    parts.append("")
    parts.append(discussion(doc))
    for wl in doc["workloads"]:
        for mode in ("saturated", "trace"):
            sel = [r for r in runs if r["workload"] == wl and r["mode"] == mode]
            scale = sel[-1]["time_scale"] if sel and mode == "trace" else None
            extra = (f" Arrival times x{scale:.2f} at the last G (the scale is set per G)."
                     if scale else "")
            parts += [f"## {wl}, {mode}\n", extra.strip() + ("\n" if extra else ""),
                      _table(sel, jsq)]
    return "\n".join(parts) + "\n"





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
