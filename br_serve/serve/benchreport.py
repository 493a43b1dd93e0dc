"""``bench-serve``'s other half: the simulator's prediction, the gains, the table.

Why an ensemble. One replay of a trace under JSQ is chaotic: moving arrivals by a few
milliseconds changes which step a request lands in, which replica a long request
joins, and so the run's imbalance (on the Mooncake conversation trace, 240 requests,
G=8: the simulated br0-over-jsq gain is +16.8% on the exact trace but +12.6%..+16.3%
with 10-50 ms of arrival jitter). A live run is one such perturbed replay, so it is
compared with the simulator's *ensemble*: the same trace replayed ``seeds`` times with
Gaussian arrival jitter of ``jitter_s`` (paired: policy A and B see the same jittered
trace), summarised as mean and standard deviation. The exact-trace value is kept beside
it as ``point``. Live repeats give the measured mean and its standard error.

Two comparisons, both printed:
- model-priced: measured barrier loads priced with the step model, against the
  simulator as configured (same step model): what the policies did to balance;
- wall-clock: measured step times, against the simulator with the measured mean host
  overhead per step (wall minus model price, over every run, one constant for all
  policies) added to the step model's constant term.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from br_serve.serve.config import GraphConfig

#: The issue's acceptance band for measured-vs-simulated gain.
GOAL_PP = 3.0

_SIM_KEYS = ("throughput_tok_s", "tpot_p50_ms", "tpot_p95_ms", "ttft_p50_ms",
             "mean_imbalance_tokens", "balanced_bound_tok_s", "makespan_s", "steps")


def jittered(trace: Any, jitter_s: float, seed: int) -> Any:
    """``trace`` with every arrival moved by N(0, ``jitter_s``) (clipped at 0); seed 0 and
    ``jitter_s == 0`` return ``trace`` itself."""
    from br_serve.traces import Trace

    if seed == 0 or jitter_s <= 0:
        return trace
    rng = np.random.default_rng(seed)
    arr = np.maximum(np.asarray(trace.arrival_s) + rng.normal(0.0, jitter_s, len(trace)), 0.0)
    return Trace.build(arr, trace.input_tokens, trace.output_tokens)


def simulate_one(trace: Any, cfg: GraphConfig, extra_step_s: float = 0.0) -> dict[str, Any]:
    """Simulate ``cfg`` (step and prefill models scaled by ``time_scale``) on ``trace``."""
    from br_serve.sim import parse_sim_config, simulate

    ts = cfg.time_scale
    scfg = parse_sim_config(
        policy=cfg.policy, predictor=None if cfg.predictor == "survives" else cfg.predictor,
        replicas=cfg.replicas, slots=cfg.slots, horizon=cfg.horizon, seed=cfg.seed,
        step_a_s_per_token=cfg.step_a_s_per_token * ts,
        step_b_s=cfg.step_b_s * ts + extra_step_s,
        prefill_instances=cfg.prefill_replicas, prefill_p0_s=cfg.prefill_base_s * ts,
        prefill_p1_s_per_token=cfg.prefill_s_per_token * ts,
        pool_capacity=cfg.pool_capacity)
    s = simulate(trace, scfg).summary()
    return {k: s.get(k) for k in _SIM_KEYS}


def simulate_ensemble(trace: Any, cfg: GraphConfig, jitter_s: float, seeds: int,
                      extra_step_s: float = 0.0) -> dict[str, Any]:
    """The exact trace (``point``) and ``seeds`` jittered replays (lists, seed order)."""
    point = simulate_one(trace, cfg, extra_step_s)
    runs = [simulate_one(jittered(trace, jitter_s, s), cfg, extra_step_s)
            for s in range(1, seeds + 1)]
    return {"point": point,
            "throughput_tok_s": [r["throughput_tok_s"] for r in runs],
            "mean_imbalance_tokens": [r["mean_imbalance_tokens"] for r in runs],
            "tpot_p95_ms": [r["tpot_p95_ms"] for r in runs]}


def host_overhead_s(runs: list[dict[str, Any]]) -> float:
    """Mean (wall - model-priced) seconds per busy step over every measured run."""
    busy = sum(r["measured"]["busy_s"] for r in runs)
    model = sum(r["measured"]["model_busy_s"] for r in runs)
    steps = sum(r["measured"]["busy_steps"] for r in runs)
    return max(busy - model, 0.0) / steps if steps else 0.0


def _stats(xs: list[float]) -> dict[str, Any]:
    a = np.asarray([x for x in xs if x is not None], dtype=np.float64)
    if not len(a):
        return {"values": [], "mean": None, "sd": None, "se": None}
    sd = float(a.std(ddof=1)) if len(a) > 1 else None
    return {"values": [float(x) for x in a], "mean": float(a.mean()), "sd": sd,
            "se": None if sd is None else sd / math.sqrt(len(a))}


def _pct(new: list[float], old: list[float]) -> list[float]:
    return [100.0 * (b / a - 1.0) for a, b in zip(old, new, strict=True) if a and b]


def gains(runs: list[dict[str, Any]], sims: dict[str, Any],
          sims_overhead: dict[str, Any]) -> dict[str, Any]:
    """Gain of every policy over ``jsq``: measured per repeat (paired within a repeat),
    simulated per jittered seed (paired within a seed); means, spreads, differences."""
    pols = list(dict.fromkeys(r["policy"] for r in runs))
    if "jsq" not in pols:
        return {}

    def series(pol: str, key: str) -> list[float]:
        return [r["measured"][key] for r in sorted(
            (r for r in runs if r["policy"] == pol), key=lambda r: r["repeat"])]

    out: dict[str, Any] = {}
    for pol in pols:
        if pol == "jsq":
            continue
        n = min(len(series(pol, "throughput_tok_s")), len(series("jsq", "throughput_tok_s")))
        wall = _stats(_pct(series(pol, "throughput_tok_s")[:n],
                           series("jsq", "throughput_tok_s")[:n]))
        model = _stats(_pct(series(pol, "model_throughput_tok_s")[:n],
                            series("jsq", "model_throughput_tok_s")[:n]))
        g: dict[str, Any] = {"measured_wall": wall, "measured_model": model}
        if pol in sims and "jsq" in sims:
            s, j = sims[pol], sims["jsq"]
            g["sim_point_pct"] = 100.0 * (s["point"]["throughput_tok_s"]
                                          / j["point"]["throughput_tok_s"] - 1.0)
            g["sim"] = _stats(_pct(s["throughput_tok_s"], j["throughput_tok_s"]))
            if model["mean"] is not None and g["sim"]["mean"] is not None:
                g["model_difference_pp"] = model["mean"] - g["sim"]["mean"]
        if pol in sims_overhead and "jsq" in sims_overhead:
            s, j = sims_overhead[pol], sims_overhead["jsq"]
            g["sim_overhead"] = _stats(_pct(s["throughput_tok_s"], j["throughput_tok_s"]))
            if wall["mean"] is not None and g["sim_overhead"]["mean"] is not None:
                g["wall_difference_pp"] = wall["mean"] - g["sim_overhead"]["mean"]
        diffs = [g.get("model_difference_pp"), g.get("wall_difference_pp")]
        g["within_goal"] = all(d is not None and abs(d) <= GOAL_PP for d in diffs)
        out[f"{pol}_over_jsq"] = g
    return out


def _mean(xs: list[Any]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.mean(vals)) if vals else None


def format_table(result: dict[str, Any]) -> str:
    """Markdown: one row per policy (means over repeats), then the gain lines."""
    def f(v: Any, p: int = 1) -> str:
        return "-" if v is None else f"{v:,.{p}f}"

    def pm(st: dict[str, Any] | None, key: str = "sd") -> str:
        if not st or st.get("mean") is None:
            return "-"
        return f"{st['mean']:+.2f}%" + ("" if st.get(key) is None else f" ± {st[key]:.2f}")

    lines = ["| policy | runs | thr tok/s wall (meas / sim+overhead) | thr tok/s model-priced "
             "(meas / sim) | TPOT P95 ms (meas / sim) | imbalance tokens (meas / sim) | "
             "lost | bad tokens | tick+dispatch / step |",
             "|---|---|---|---|---|---|---|---|---|"]
    sims, simo = result.get("simulated", {}), result.get("simulated_overhead", {})
    for pol in dict.fromkeys(r["policy"] for r in result["runs"]):
        ms = [r["measured"] for r in result["runs"] if r["policy"] == pol]
        s, so = sims.get(pol, {}), simo.get(pol, {})
        share = max((m["tick_dispatch_share_of_step"] or 0.0) for m in ms)
        lines.append(
            f"| {pol} | {len(ms)} | {f(_mean([m['throughput_tok_s'] for m in ms]))} / "
            f"{f(_mean(so.get('throughput_tok_s', [])))} | "
            f"{f(_mean([m['model_throughput_tok_s'] for m in ms]))} / "
            f"{f(_mean(s.get('throughput_tok_s', [])))} | "
            f"{f(_mean([m['tpot_p95_ms'] for m in ms]))} / "
            f"{f(_mean(s.get('tpot_p95_ms', [])))} | "
            f"{f(_mean([m['mean_imbalance_tokens'] for m in ms]), 0)} / "
            f"{f(_mean(s.get('mean_imbalance_tokens', [])), 0)} | "
            f"{sum(m['requests_lost'] for m in ms)} | {sum(m['bad_tokens'] for m in ms)} | "
            f"{f(100 * share, 2)}% (max) |")
    lines.append("")
    lines.append("Simulator columns: mean over the jittered ensemble "
                 f"({result.get('sim_seeds')} seeds, {result.get('sim_jitter_s')} s); "
                 f"host overhead {f(1e3 * result.get('host_overhead_s', 0.0), 1)} ms/step.")
    for k, g in result["gains"].items():
        lines.append(
            f"\n{k}: model-priced measured {pm(g['measured_model'], 'se')} (mean ± s.e., "
            f"{len(g['measured_model']['values'])} runs) vs simulated {pm(g.get('sim'))} "
            f"(mean ± s.d.; exact trace {f(g.get('sim_point_pct'), 2)}%): difference "
            f"{f(g.get('model_difference_pp'), 2)} pp; wall-clock measured "
            f"{pm(g['measured_wall'], 'se')} vs simulated with overhead "
            f"{pm(g.get('sim_overhead'))}: difference {f(g.get('wall_difference_pp'), 2)} pp; "
            f"within {GOAL_PP:g} pp: {'yes' if g['within_goal'] else 'NO'}")
    return "\n".join(lines)
