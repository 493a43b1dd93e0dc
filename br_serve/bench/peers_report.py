"""``bench-peers`` results: paired gains, the simulator beside them, a table and a plot.

Pairing: runs of two arms on the same window and mode are paired; a gain is the mean
over windows of ``x_arm / x_base - 1`` with its 95% t-interval
(:func:`br_serve.sim.stats.paired`; K < 2 gives no interval). ``round_robin`` of a
protocol's routers is that protocol's baseline; "best real router" is, per protocol and
mode, the router arm with the highest mean ``output_tok_s``.

Simulator beside it (:func:`simulate_windows`): each arm's ``sim_policy`` (the graph's:
its own policy) simulated on the same windows with the same step model; an arm whose
policy is not registered yet is skipped with a message. The graph is simulated with the
engine queue it runs live (``pool.dispatch_ahead``, :class:`SimArm`); without it the
model is its no-queue ceiling. The agreement table sets the measured engine-side gain
over round robin (``tokens_per_busy_s``, the simulator's throughput definition) beside
the simulated one, for every router rule and the graph; it agrees when the simulated
mean lies inside the measured interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from br_serve.sim.stats import paired

#: (label in tables, path into a run's measured dict)
METRICS = (("output tok/s", ("output_tok_s",)),
           ("TPOT P50 ms", ("tpot_p50_ms",)), ("TPOT P95 ms", ("tpot_p95_ms",)),
           ("TTFT P50 s", ("ttft_p50_ms",)), ("TTFT P95 s", ("ttft_p95_ms",)),
           ("engine tok/busy-s", ("engine", "tokens_per_busy_s")),
           ("imbalance tok", ("engine", "mean_imbalance_tokens")),
           ("barrier idle", ("engine", "barrier_idle_share")))


def value(run: dict[str, Any], path: tuple[str, ...]) -> float | None:
    v: Any = run.get("measured", {})
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return float(v) if isinstance(v, (int, float)) else None


def _by(rows: list[dict[str, Any]], protocol: str, mode: str, scale: float,
        arm: str) -> dict[int, dict[str, Any]]:
    return {r["window"]: r for r in rows if r["protocol"] == protocol and r["mode"] == mode
            and r["rate_scale"] == scale and r["arm"] == arm and "failed" not in r["measured"]}


def gain(rows: list[dict[str, Any]], protocol: str, mode: str, scale: float, arm: str,
         base: str, path: tuple[str, ...] = ("output_tok_s",)) -> dict[str, Any] | None:
    """Paired relative gain of ``arm`` over ``base`` (see the module docstring)."""
    a, b = _by(rows, protocol, mode, scale, arm), _by(rows, protocol, mode, scale, base)
    d = [va / vb - 1.0 for w in sorted(a.keys() & b.keys())
         if (va := value(a[w], path)) is not None and (vb := value(b[w], path))]
    if not d:
        return None
    p = paired(d)
    return {**p.as_dict(), "tie": p.tie}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (protocol, mode, scale, arm): metric means over windows and gains
    over round robin and (graph) over the best real router."""
    keys = sorted({(r["protocol"], r["mode"], r["rate_scale"]) for r in rows})
    out = []
    for protocol, mode, scale in keys:
        arms = [a for a in dict.fromkeys(r["arm"] for r in rows)
                if _by(rows, protocol, mode, scale, a)]
        means = {a: _means(_by(rows, protocol, mode, scale, a)) for a in arms}
        routers = [a for a in arms if not a.startswith("graph")]
        rr = next((a for a in routers if a.endswith(":round_robin")), None)
        best = max(routers, key=lambda a: means[a].get("output tok/s") or 0.0,
                   default=None)
        for a in arms:
            row = {"protocol": protocol, "mode": mode, "rate_scale": scale, "arm": a,
                   "windows": len(_by(rows, protocol, mode, scale, a)), **means[a],
                   "best_router": best}
            if rr and a != rr:
                row["gain_vs_round_robin"] = gain(rows, protocol, mode, scale, a, rr)
                row["engine_gain_vs_round_robin"] = gain(
                    rows, protocol, mode, scale, a, rr, ("engine", "tokens_per_busy_s"))
            if a.startswith("graph") and best:
                row["gain_vs_best_router"] = gain(rows, protocol, mode, scale, a, best)
                for name, path in (("tpot_p95_vs_best", ("tpot_p95_ms",)),
                                   ("ttft_p50_vs_best", ("ttft_p50_ms",))):
                    row[name] = gain(rows, protocol, mode, scale, a, best, path)
            out.append(row)
    return out


def _means(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, path in METRICS:
        xs = [v for r in runs.values() if (v := value(r, path)) is not None]
        v = sum(xs) / len(xs) if xs else None
        out[label] = v / 1e3 if v is not None and label.startswith("TTFT") else v
    out["lost"] = sum(int(r["measured"].get("requests_lost", 0)) for r in runs.values())
    out["bad_tokens"] = sum(int(r["measured"].get("bad_tokens", 0)) for r in runs.values())
    return out


@dataclass(frozen=True, slots=True)
class SimArm:
    """What the simulator runs for one arm: ``policy`` (a registered policy name),
    ``options`` (that policy's options), ``predictor`` (a registered predictor
    name, for policies that look ahead; ``None`` keeps the base config's) and
    ``engine_queue`` (requests bound ahead per rank, queued at its engine beyond its
    slots: the graph's resolved ``pool.dispatch_ahead`` as it runs live in front of
    remote engines; 0 for a router, which binds at arrival and whose policy model
    already queues at the engine) and ``turnover_steps`` (engine steps from a bind to
    the request's first decode when nothing is queued for it: the graph's turnover at
    ``engine_queue`` 0, its replica's report, tick, admit and install; the
    simulator's ``sim.admit_delay_steps``, not modelled beside an engine queue)."""

    policy: str
    options: Mapping[str, Any] = field(default_factory=dict)
    predictor: str | None = None
    engine_queue: int = 0
    turnover_steps: int = 0

    def __post_init__(self) -> None:
        if self.engine_queue < 0:
            raise ValueError(f"engine_queue: must be >= 0 (got {self.engine_queue})")
        if self.turnover_steps < 0 or (self.turnover_steps and self.engine_queue):
            raise ValueError(f"turnover_steps: must be >= 0 and only with engine_queue 0 "
                             f"(got {self.turnover_steps} with {self.engine_queue})")


#: the per-window metrics :func:`simulate_windows` returns (means over seeds)
SIM_METRICS = ("throughput_tok_s", "balanced_bound_tok_s", "mean_imbalance_tokens",
               "tpot_p95_ms", "ttft_p50_ms")


def simulate_windows(base: Any, windows: list[Any], arms: Mapping[str, SimArm],
                     saturated: bool, say: Callable[[str], None] = print, seeds: int = 1,
                     spread_s: float = 0.0, tick_per_delivery: bool = False
                     ) -> dict[str, Any]:
    """``{arm: {"policy", "options", "seeds", <SIM_METRICS>: [per window], ...} |
    {"skipped": why}}``: each arm's simulator policy on the same windows and step model.

    Arrivals: ``saturated`` puts a window's requests at t = 0, or, with ``spread_s``
    > 0, evenly over ``[0, spread_s)`` (live, a saturated window reaches the pool over
    about a second); otherwise the window's own arrival times (``spread_s`` must then
    be 0). Each window is simulated with ``seeds`` seeds (the graph's seed and the next
    ones) and each metric is the mean over them: a rule that draws at random (power of
    two, a hash ring) is predicted by its mean over draws, not by one draw, which at 64
    requests per window swings by whole waves; a deterministic rule gives the same
    value for every seed. ``balanced_bound_tok_s`` is the arm's own run with every step
    priced at the mean rank load: the ceiling of balancing alone on that run.
    ``tick_per_delivery``: each request reaches the policy alone, as it does live
    (``sim.tick_per_delivery``)."""
    if seeds < 1:
        raise ValueError(f"--sim-seeds: must be >= 1 (got {seeds})")
    if spread_s < 0 or (spread_s and not saturated):
        raise ValueError(f"spread_s: must be >= 0 and only with saturated (got {spread_s})")
    from br_serve.bench.serve_report import simulate_one
    from br_serve.core.policy import POLICIES
    from br_serve.serve.config import parse_graph_config
    from br_serve.traces import Trace

    out: dict[str, Any] = {}
    for label, arm in arms.items():
        pol, opts = arm.policy, dict(arm.options)
        if pol not in POLICIES:
            msg = f"simulator policy {pol!r} (for {label}) is not registered yet: skipped"
            say(msg)
            out[label] = {"policy": pol, "skipped": msg}
            continue
        extra: dict[str, Any] = {"predictor": {"name": arm.predictor}} if arm.predictor else {}
        cfgs = [parse_graph_config(base, policy={"name": pol, "options": opts},
                                   seed=base.seed + i, **extra) for i in range(seeds)]
        res: dict[str, list[Any]] = {k: [] for k in SIM_METRICS}
        for w in windows:
            m = len(w.arrival_s)
            arr = ([spread_s * i / m for i in range(m)] if saturated
                   else list(w.arrival_s))
            trace = Trace.build(arr, list(w.prompt_tokens), list(w.output_tokens))
            draws = [simulate_one(trace, cfg, engine_queue=arm.engine_queue,
                                  admit_delay_steps=arm.turnover_steps,
                                  tick_per_delivery=tick_per_delivery) for cfg in cfgs]
            for k in res:
                vals = [d[k] for d in draws if d.get(k) is not None]
                res[k].append(sum(vals) / len(vals) if vals else None)
        pred = {"predictor": arm.predictor} if arm.predictor else {}
        out[label] = {"policy": pol, "options": opts, **pred, "seeds": seeds,
                      "engine_queue": arm.engine_queue,
                      **({"turnover_steps": arm.turnover_steps} if arm.turnover_steps
                         else {}), **res}
    return out


def agreement(summary: list[dict[str, Any]], sims: dict[str, Any],
              protocol_rr: dict[str, str], mode: str = "saturated") -> list[dict[str, Any]]:
    """Per real router rule, and for the graph's own policy (simulated with the
    engine queue it runs live, :class:`SimArm`): measured engine-side gain over round
    robin (interval) beside the simulated gain of its policy over ``round_robin`` on
    the same windows."""
    out = []
    for row in summary:
        if row["mode"] != mode:
            continue
        arm, rr = row["arm"], protocol_rr.get(row["protocol"])
        meas = row.get("engine_gain_vs_round_robin")
        sim, sim_rr = sims.get(arm, {}), sims.get(rr or "", {})
        if "skipped" in sim or "skipped" in sim_rr or not sim or not sim_rr:
            out.append({"arm": arm, "sim_policy": sim.get("policy"), "measured": meas,
                        "simulated": None, "agrees": None,
                        "note": sim.get("skipped") or sim_rr.get("skipped")})
            continue
        d = [a / b - 1 for a, b in zip(sim["throughput_tok_s"], sim_rr["throughput_tok_s"],
                                       strict=True) if a and b]
        simulated = paired(d).mean if d else None
        ci = (meas or {}).get("ci95")
        agrees = (None if arm == rr else bool(ci and simulated is not None
                                              and ci[0] <= simulated <= ci[1]))
        out.append({"arm": arm, "sim_policy": sim["policy"],
                    "sim_options": sim.get("options") or {}, "measured": meas,
                    "simulated": simulated, "agrees": agrees})
    return out


def _f(v: Any, p: int = 1) -> str:
    return "-" if v is None else f"{v:.{p}f}"


def _g(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    ci = g.get("ci95")
    return (f"{100 * g['mean']:+.1f}%" + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
                                           if ci else ""))


def markdown(result: dict[str, Any]) -> str:
    """The results as markdown tables (one per protocol and mode)."""
    lines: list[str] = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in result["summary"]:
        groups.setdefault((row["protocol"], row["mode"], row["rate_scale"]), []).append(row)
    for (protocol, mode, scale), rows in groups.items():
        lines += [f"### {protocol} engines, {mode}" + (f" x{scale:g}" if mode == "timed"
                                                       else ""), "",
                  "| arm | output tok/s | vs round robin | graph vs best router | "
                  "TPOT P50/P95 ms | TTFT P50/P95 s | engine imbalance tok | barrier idle "
                  "| lost |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['arm']} | {_f(r['output tok/s'])} | {_g(r.get('gain_vs_round_robin'))}"
                f" | {_g(r.get('gain_vs_best_router'))} | {_f(r['TPOT P50 ms'])} / "
                f"{_f(r['TPOT P95 ms'])} | {_f(r['TTFT P50 s'], 2)} / {_f(r['TTFT P95 s'], 2)}"
                f" | {_f(r['imbalance tok'], 0)} | {_f(r['barrier idle'], 3)} | "
                f"{r['lost']} |")
        lines.append("")
    if result.get("capacity"):
        slo = result.get("slo", {})
        lines += [f"### capacity at the SLO (TPOT P95 <= {_f(slo.get('tpot_p95_ms'))} ms, "
                  f"TTFT P95 <= {_f(slo.get('ttft_p95_s'))} s; per window, paired)", "",
                  "| protocol | arm | req/s (mean over windows) | windows met / capped | "
                  "vs round robin | graph vs best router | TPOT P95 ms at it | TTFT P95 s "
                  "at it | barrier idle at it |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {c['protocol']} | {c['arm']} | {_f(c['capacity_req_s'], 3)} | "
                  f"{c['windows_met']} / {c['windows_capped']} | "
                  f"{_g(c.get('vs_round_robin'))} | {_g(c.get('vs_best_router'))} | "
                  f"{_f(c['tpot_p95_ms'])} | {_f(c['ttft_p95_s'], 2)} | "
                  f"{_f(c['barrier_idle_share'], 3)} |" for c in result["capacity"]]
        lines.append("")
    if result.get("agreement"):
        lines += ["### simulator vs real (saturated, engine tok/busy-s gain over round "
                  "robin)", "", "| rule | sim policy | measured | simulated | agrees |",
                  "|---|---|---|---|---|"]
        for a in result["agreement"]:
            sim = "-" if a["simulated"] is None else f"{100 * a['simulated']:+.1f}%"
            verdict = a["agrees"] if a["agrees"] is not None else (a.get("note") or "-")
            opts = ", ".join(f"{k}={v}" for k, v in (a.get("sim_options") or {}).items())
            pol = f"{a['sim_policy']}" + (f" ({opts})" if opts else "")
            lines.append(f"| {a['arm']} | {pol} | {_g(a['measured'])} | {sim} "
                         f"| {verdict} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str) -> None:
    """Output tok/s and engine imbalance per arm (means, saturated), one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["summary"] if r["mode"] == "saturated"]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5))
    labels = [f"{r['protocol']}: {r['arm']}" for r in rows]
    for ax, key in zip(axes, ("output tok/s", "imbalance tok"), strict=True):
        ax.barh(labels, [r[key] or 0 for r in rows],
                color=["tab:green" if r["arm"].startswith("graph") else "tab:gray"
                       for r in rows])
        ax.set_xlabel(key + " (mean over windows)")
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    fig.suptitle("bench-peers, saturated windows")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
