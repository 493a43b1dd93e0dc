"""Exploration ensembles for the policy work of issue 14 (not the project's harness).

A minimal paired ensemble, kept only until the replay-ensemble harness (``br-serve sim
--replays``, ``br-serve capacity``) is on main: K random contiguous windows of N
requests of one workload (stratified starts, seeded), every spec simulated on the same
windows, gains paired per window. Modes:

- ``saturated``: every request at t = 0; reports the steady window (until the pool
  first runs empty) and the whole run (window + drain);
- ``stationary``: saturated with the pool capped at ``--pool-depth`` (default 4 G B),
  measured from the ``depth + 2 G B``-th admission to the last pool entry;
- ``trace``: arrivals scaled so the offered token rate is ``--load`` x JSQ's saturated
  throughput on the same window (a shallow pool).

Usage::

    python -m research.algo_explore --workload servegen-r1 --replicas 8 \\
        --mode saturated --windows 8 --requests 1500 --seed 100 --jobs 1 \\
        --spec jsq --spec br0 --spec 'brh+oracle' --spec 'h10@brh+oracle:horizon=10'

A spec is ``[label@]policy[+predictor][:key=value,...]``; a key ``pred.NAME`` is a
predictor option (``a;b;c``: a tuple of ints, e.g. ``pred.prompt_buckets=40;300``).
Prints mean +- s.e. of the paired gain against ``--baseline`` (default jsq) and against
``--versus`` (default br0), and writes every run to ``--json`` when given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.bench.workloads import WORKLOADS, load_workload
from br_serve.sim import parse_sim_config, simulate
from br_serve.sim.result import SimResult
from br_serve.traces import Trace

#: the baselines "better than the field" is measured against (capacity mode)
FIELD = frozenset({"jsq", "sglang_total_tokens", "vllm_dp", "min_max"})


def parse_spec(text: str) -> dict[str, Any]:
    label, _, rest = text.partition("@") if "@" in text else ("", "", text)
    head, _, opts = rest.partition(":")
    policy, _, pred = head.partition("+")
    options: dict[str, Any] = {}
    pred_options: dict[str, Any] = {}
    for kv in filter(None, opts.split(",")):
        k, _, v = kv.partition("=")
        k, v = k.strip(), v.strip()
        if k.startswith("pred."):  # a predictor option; "a;b;c" is a tuple of ints
            pred_options[k[5:]] = tuple(int(x) for x in v.split(";")) if ";" in v else v
        else:
            options[k] = v
    return {"label": label or text, "policy": policy, "predictor": pred or None,
            "options": options, "predictor_options": pred_options}


def windows(n: int, k: int, width: int, seed: int) -> list[int]:
    span = n - width + 1
    out = []
    for r in range(k):
        rng = np.random.default_rng([seed, r, 0])
        lo = (r * span) // k
        hi = max(lo + 1, ((r + 1) * span) // k)
        out.append(int(rng.integers(lo, hi)))
    return out


def _stationary(res: SimResult, prompts: np.ndarray, depth: int, g: int, b: int
                ) -> dict[str, Any]:
    s = res.steps
    ends = res.step_end_s()
    starts = ends - s.tau_s
    adm = np.sort(res.admit_step[res.admit_step >= 0])
    w0 = int(adm[min(depth + 2 * g * b, adm.size - 1)])
    last_enq = float(np.nanmax(res.enqueue_s))
    w1 = int(np.searchsorted(starts, last_enq, side="right"))
    hi = min(w1 + 1, len(s))
    out: dict[str, Any] = {"stat_steps": hi - w0}
    if hi <= w0:
        return out | {"stat_thr": None}
    tok = float(s.running[w0:hi].sum())
    out["stat_thr"] = tok / float(s.tau_s[w0:hi].sum())
    out["stat_bound"] = tok / float(s.balanced_tau_s[w0:hi].sum())
    out["stat_imb"] = float(s.imbalance_tokens[w0:hi].mean())
    # wait beyond FCFS in seconds: admission rank q vs pool-entry rank p (trace order)
    ok = res.admit_step >= 0
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((idx, res.admit_step[idx]))]
    t_adm = starts[np.minimum(res.admit_step[order], len(s) - 1)]
    q = np.empty(len(res.admit_step), dtype=np.int64)
    q[order] = np.arange(order.size)
    p = np.searchsorted(idx, idx)  # idx is trace order = FCFS order
    wait = np.maximum(0.0, t_adm[q[idx]] - t_adm[p])
    inwin = (res.admit_step[idx] >= w0) & (res.admit_step[idx] < hi)
    w = wait[inwin]
    out["wait_p99_s"] = float(np.percentile(w, 99)) if w.size else None
    out["wait_max_s"] = float(w.max()) if w.size else None
    pr = np.asarray(prompts)[idx]
    fc = np.zeros(len(idx), dtype=bool)
    before = int((res.admit_step[idx] < w0).sum())
    fc[before:before + int(inwin.sum())] = True
    out["adm_prompt_ratio"] = float(pr[inwin].mean() / max(pr[fc].mean(), 1e-9))
    return out


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    tr: Trace = task["trace"]
    sp = task["spec"]
    g, b = task["replicas"], task["slots"]
    mode = task["mode"]
    extra: dict[str, Any] = {}
    if mode == "stationary":
        extra["pool_capacity"] = task["depth"]
    if mode == "trace":
        tr = tr.scaled(task["scale"])
    cfg = parse_sim_config(policy=sp["policy"], predictor=sp["predictor"], replicas=g, slots=b,
                    sim_saturated=mode != "trace", seed=task["seed"],
                    policy_options=sp["options"],
                    predictor_options=sp.get("predictor_options", {}), **extra)
    pred = None
    if sp["predictor"] and task.get("warm") is not None:
        from br_serve.sim.predict import build_predictor
        from predictors import warm_start
        pred = build_predictor(cfg)
        w: Trace = task["warm"]
        if pred is not None:
            warm_start(pred, w.input_tokens, w.output_tokens, hash_ids=w.hash_ids)
    t0 = time.perf_counter()
    res = simulate(tr, cfg, predictor=pred)
    s = res.summary()
    row = {k: s[k] for k in ("throughput_tok_s", "balanced_bound_tok_s",
                             "mean_imbalance_tokens", "tpot_p95_ms", "ttft_p95_ms",
                             "tick_p50_us", "predictor_failed_ticks")}
    tot = res.steps
    row["whole_thr"] = float(tot.running.sum() / tot.tau_s.sum())
    row["whole_bound"] = float(tot.running.sum() / tot.balanced_tau_s.sum())
    ends = res.step_end_s()
    row["makespan_s"] = float(ends[-1])
    if mode == "stationary":
        row |= _stationary(res, tr.input_tokens, task["depth"], g, b)
    row["wall_s"] = time.perf_counter() - t0
    row["label"] = sp["label"]
    row["window"] = task["window"]
    return row


def capacity(a: argparse.Namespace, wins: list[Trace], specs: list[dict[str, Any]],
             full: Trace) -> int:
    """Highest load (share of JSQ's saturated throughput, per window) at which the
    window-mean TTFT P95 and TPOT P95 both meet the SLO: geometric bisection to 2%."""
    step_a, step_b = 5e-7, 0.03
    tpot_slo = a.slo_tpot_factor * 1e3 * (step_b + step_a * a.slots * (
        float(full.input_tokens.mean()) + float(full.output_tokens.mean()) / 2))
    caps = []
    for w in wins:
        jsq = simulate(w, parse_sim_config(policy="jsq", replicas=a.replicas, slots=a.slots,
                                    sim_saturated=True))
        caps.append(float(w.output_tokens.sum() / max(w.duration_s, 1e-9))
                    / jsq.summary()["throughput_tok_s"])

    def meets(sp: dict[str, Any], load: float) -> tuple[bool, float, float]:
        tasks = [dict(trace=w, spec=sp, replicas=a.replicas, slots=a.slots, mode="trace",
                      seed=a.seed + i, window=i, depth=0, scale=caps[i] / load, warm=None)
                 for i, w in enumerate(wins)]
        if a.jobs > 1:
            with ProcessPoolExecutor(a.jobs) as ex:
                rows = list(ex.map(run_one, tasks))
        else:
            rows = [run_one(t) for t in tasks]
        ttft = float(np.mean([r["ttft_p95_ms"] or 0.0 for r in rows])) / 1e3
        tpot = float(np.mean([r["tpot_p95_ms"] or 0.0 for r in rows]))
        return ttft <= a.slo_ttft_s and tpot <= tpot_slo, ttft, tpot

    print(f"# capacity {a.workload} G={a.replicas} B={a.slots} K={len(wins)} N={a.requests} "
          f"seed={a.seed}: SLO TTFT P95 <= {a.slo_ttft_s} s, TPOT P95 <= {tpot_slo:.1f} ms; "
          "load = offered / JSQ's saturated throughput")
    out = {}
    for sp in specs:
        lo, hi = 0.5, 1.4
        ok_lo = meets(sp, lo)
        if not ok_lo[0]:
            print(f"{sp['label']:<28} capacity < {lo} (ttft {ok_lo[1]:.2f} s, tpot "
                  f"{ok_lo[2]:.1f} ms at {lo})")
            out[sp["label"]] = 0.0
            continue
        at = ok_lo
        while hi / lo - 1 > 0.02:
            mid = math.sqrt(lo * hi)
            got = meets(sp, mid)
            if got[0]:
                lo, at = mid, got
            else:
                hi = mid
        out[sp["label"]] = lo
        print(f"{sp['label']:<28} capacity {lo:.3f} x JSQ sat. (ttft {at[1]:.2f} s, tpot "
              f"{at[2]:.1f} ms there)")
    # the field's routers only (labels of our own variants, e.g. "hold2s", say nothing)
    best = max((out[sp["label"]] for sp in specs if sp["policy"] in FIELD), default=0)
    for k, v in out.items():
        if best:
            print(f"  {k:<26} vs best baseline: {100 * (v / best - 1):+.1f}%")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "capacity": out,
                                            "tpot_slo_ms": tpot_slo}, indent=1))
    return 0


def mean_se(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs, dtype=np.float64)
    m = float(a.mean())
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float("nan")
    return m, se


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", default="servegen-r1", choices=sorted(WORKLOADS))
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--mode", default="saturated",
                   choices=["saturated", "stationary", "trace", "capacity"])
    p.add_argument("--slo-ttft-s", type=float, default=10.0)
    p.add_argument("--slo-tpot-factor", type=float, default=1.25,
                   help="TPOT P95 SLO = this x the unloaded full-batch step time")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--warm", type=int, default=0,
                   help="warm-start predictors with the first N requests; windows from the rest")
    p.add_argument("--pool-depth", type=int, default=None)
    p.add_argument("--load", type=float, default=0.95, help="trace mode: share of JSQ capacity")
    p.add_argument("--spec", action="append", required=True)
    p.add_argument("--baseline", default="jsq")
    p.add_argument("--versus", default="br0")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    full = load_workload(a.workload)
    warm = full.take(np.arange(a.warm)) if a.warm else None
    rest = full.take(np.arange(a.warm, len(full))) if a.warm else full
    starts = windows(len(rest), a.windows, a.requests, a.seed)
    specs = [parse_spec(s) for s in a.spec]
    depth = a.pool_depth or 4 * a.replicas * a.slots
    scales: list[float] = [1.0] * len(starts)
    wins = [rest.take(np.arange(s0, s0 + a.requests)) for s0 in starts]
    if a.mode in ("trace", "capacity"):
        for i, w in enumerate(wins):  # JSQ saturated capacity of this window
            jsq = simulate(w, parse_sim_config(policy="jsq", replicas=a.replicas, slots=a.slots,
                                        sim_saturated=True))
            cap = jsq.summary()["throughput_tok_s"]
            offered = w.output_tokens.sum() / max(w.duration_s, 1e-9)
            scales[i] = float(offered / (a.load * cap))
    if a.mode == "capacity":
        return capacity(a, wins, specs, full)
    tasks = [dict(trace=w, spec=sp, replicas=a.replicas, slots=a.slots, mode=a.mode,
                  seed=a.seed + i, window=i, depth=depth, scale=scales[i], warm=warm)
             for i, w in enumerate(wins) for sp in specs]
    t0 = time.perf_counter()
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            rows = list(ex.map(run_one, tasks))
    else:
        rows = [run_one(t) for t in tasks]
    wall = time.perf_counter() - t0
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["label"], {})[r["window"]] = r
    metrics = [("throughput_tok_s", "balanced_bound_tok_s", "steady")]
    if a.mode == "saturated":
        metrics.append(("whole_thr", "whole_bound", "whole"))
    if a.mode == "stationary":
        metrics = [("stat_thr", "stat_bound", "stationary")]
    print(f"# {a.workload} G={a.replicas} B={a.slots} mode={a.mode} K={a.windows} "
          f"N={a.requests} seed={a.seed} warm={a.warm} ({wall:.0f} s)")
    for thr_k, bound_k, name in metrics:
        print(f"## {name}: gain vs {a.baseline} | vs {a.versus} | headroom share | imb | "
              "extra")
        base = by.get(a.baseline)
        vs = by.get(a.versus)
        for sp in specs:
            mine = by[sp["label"]]
            ks = sorted(mine)
            cells = []
            for ref in (base, vs):
                if ref is None:
                    cells.append("-")
                    continue
                m, se = mean_se([mine[k][thr_k] / ref[k][thr_k] - 1 for k in ks])
                cells.append(f"{100 * m:+6.1f} ± {100 * se:4.1f}")
            share = "-"
            if base is not None:
                used = sum(mine[k][thr_k] - base[k][thr_k] for k in ks)
                room = sum(mine[k][bound_k] - base[k][thr_k] for k in ks)
                share = f"{100 * used / room:5.1f}%" if room > 0 else "-"
            imb = np.mean([mine[k]["mean_imbalance_tokens"] for k in ks])
            extra = ""
            if a.mode == "stationary":
                w99 = [mine[k].get("wait_p99_s") or 0 for k in ks]
                pr = [mine[k].get("adm_prompt_ratio") or 0 for k in ks]
                extra = (f"wait p99 {np.mean(w99):7.1f}s max "
                         f"{np.mean([mine[k].get('wait_max_s') or 0 for k in ks]):7.1f}s "
                         f"prompt ratio {np.mean(pr):.3f}")
            if a.mode == "trace":
                ttft = np.mean([mine[k]["ttft_p95_ms"] or 0 for k in ks]) / 1e3
                tpot = np.mean([mine[k]["tpot_p95_ms"] or 0 for k in ks])
                extra = f"ttft p95 {ttft:6.2f}s tpot p95 {tpot:6.1f}ms"
            tick = np.mean([mine[k]["tick_p50_us"] or 0 for k in ks])
            print(f"{sp['label']:<28} {cells[0]} | {cells[1]} | {share} | {imb:9.0f} | "
                  f"{extra} tick {tick:.0f}us")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1,
                                           default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
