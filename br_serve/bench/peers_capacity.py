"""``bench-peers --capacity``: live capacity at an SLO per window, paired across arms.

Every (arm, window) pair gets its own geometric bisection on the arrival-rate multiplier
(:class:`br_serve.sim.capacity.RateSearch`, the simulator's search) over that window's
TPOT P95 and TTFT P95 alone, as :mod:`br_serve.sim.capacity_paired` does in the
simulator: one pooled search over all windows gives one number without a spread, and
in the simulator two brackets of the same four windows were 18% apart. A comparison is
then the mean of the per-window ratios ``cap_arm,w / cap_base,w - 1`` with its 95%
t-interval (:func:`br_serve.sim.stats.paired`); a window where the baseline misses the
SLO at the bracket's bottom has no ratio (``n`` counts the windows that do).

Runs are interleaved: each round advances every pending search by one run, windows
outermost and arms inside, so a slow spell of the host hits the arms of a window alike.
A run that fails or loses a request counts as a miss of the SLO at that rate: a router
that drops work does not carry that rate.

Contract of ``run`` (default :func:`br_serve.bench.peers.run_arm`): ``run(arm, protocol,
base, requests, timeout_s) -> measured`` with ``tpot_p95_ms``, ``ttft_p95_ms``,
``requests_lost``, ``output_tok_s`` and ``engine.barrier_idle_share``; it may raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from br_serve.sim.capacity import SLO, RateSearch
from br_serve.sim.stats import paired

RunFn = Callable[..., dict[str, Any]]

#: TPOT P95 bound of the project's capacity rule, as a multiple of a full, perfectly
#: balanced replica's step (docs/results.md, "Capacity")
TPOT_STEP_FACTOR = 1.25


def default_slo(base: Any, windows: Sequence[Any], tpot_p95_ms: float | None,
                ttft_p95_s: float) -> SLO:
    """The SLO of a live capacity search: ``tpot_p95_ms`` if given, else the project's
    rule on these windows and the emulated step model: 1.25 x the step of a full,
    perfectly balanced replica of mean-size requests, ``b + a * slots * (mean prompt +
    mean output / 2)`` (``a``, ``b`` as the emulator runs them, slowdown included).

    Raises:
        ValueError: a bound <= 0 (by name).
    """
    if tpot_p95_ms is None:
        a, b, _ = base.emulated_step_model(scaled=True).arrays(base.replicas)
        prompt = float(np.mean([p for w in windows for p in w.prompt_tokens]))
        out = float(np.mean([o for w in windows for o in w.output_tokens]))
        step_s = float(np.mean(b)) + float(np.mean(a)) * base.slots * (prompt + out / 2)
        tpot_p95_ms = TPOT_STEP_FACTOR * step_s * 1e3
    return SLO(tpot_p95_ms, ttft_p95_s)


def capacity_per_window(plan: Any, slo: SLO, lo_scale: float, hi_scale: float,
                        rel_tol: float, run: RunFn | None = None,
                        progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One row per (protocol, arm): per-window capacities and paired comparisons.

    Each row: ``arm``, ``protocol``, ``per_window`` (window, ``capacity_scale``,
    ``capacity_req_s`` = scale x the window's own arrival rate, ``met``, ``capped``,
    TPOT P95 / TTFT P95 / output tok/s / barrier idle at the capacity, every
    evaluation), ``capacity_req_s`` (mean over windows, 0 for a window that misses at
    the bottom), ``best_router`` of the protocol (highest mean capacity),
    ``vs_round_robin`` and, for the graph, ``vs_best_router`` (paired, see the module
    docstring).

    Raises:
        ValueError: an empty bracket or a non-positive tolerance.
    """
    if not 0 < lo_scale < hi_scale:
        raise ValueError(f"capacity bracket: need 0 < lo < hi (got {lo_scale}, {hi_scale})")
    if rel_tol <= 0:
        raise ValueError(f"capacity tolerance: must be > 0 (got {rel_tol})")
    if run is None:
        from br_serve.bench.peers import run_arm
        run = run_arm
    searches = {(p, a.label, w.index): RateSearch(lo_scale, hi_scale)
                for w in plan.windows for p, a in plan.arms}
    rnd = 0
    while True:
        todo = [(w, p, a, s) for w in plan.windows for p, a in plan.arms
                if (s := searches[(p, a.label, w.index)].next_rate(rel_tol)) is not None]
        if not todo:
            break
        rnd += 1
        for w, p, a, scale in todo:
            try:
                m = run(a, p, plan.base, w.requests(False, scale), plan.timeout_s)
            except Exception as exc:  # a failed run misses the SLO at this rate
                m = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
            ok = "failed" not in m and m.get("requests_lost") == 0
            row = {"tpot_p95_ms": m.get("tpot_p95_ms"), "ttft_p95_ms": m.get("ttft_p95_ms"),
                   "throughput_tok_s": m.get("output_tok_s"),
                   "barrier_idle_share": (m.get("engine") or {}).get("barrier_idle_share")
                   } if ok else {}
            st = searches[(p, a.label, w.index)]
            st.record(scale, [row], slo)
            if not ok:
                st.evals[scale]["failed"] = m.get("failed") or (
                    f"{m.get('requests_lost')} request(s) lost")
            progress(f"capacity round {rnd} window {w.index} {p} {a.label} x{scale:.3g}: "
                     f"meets={st.evals[scale]['meets']} " + (
                         f"(TPOT P95 {_num(row['tpot_p95_ms'])} ms, TTFT P95 "
                         f"{_num(row['ttft_p95_ms'])} ms)" if ok else
                         f"({st.evals[scale]['failed']})"))
    rows = [_arm_row(p, a.label, a.router, [(w, searches[(p, a.label, w.index)])
                                            for w in plan.windows])
            for p, a in plan.arms]
    _compare(rows)
    return rows


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _arm_row(protocol: str, label: str, router: str,
             wins: Sequence[tuple[Any, RateSearch]]) -> dict[str, Any]:
    per = []
    for w, st in wins:
        met = not st.failed_lo and st.evals.get(st.lo, {}).get("meets", False)
        at = st.evals.get(st.lo, {}) if met else {}
        per.append({"window": w.index, "capacity_scale": st.lo if met else 0.0,
                    "capacity_req_s": st.lo * w.rate_req_s if met else 0.0,
                    "met": met, "capped": met and st.lo == st.hi0,
                    "tpot_p95_ms": at.get("tpot_p95_ms"), "ttft_p95_s": at.get("ttft_p95_s"),
                    "output_tok_s": at.get("throughput_tok_s"),
                    "barrier_idle_share": at.get("barrier_idle_share"),
                    # the search runs on the multiplier, so its own ``req_s`` is the
                    # scale: report the window's rate instead
                    "evaluations": [{**st.evals[k], "scale": k, "req_s": k * w.rate_req_s}
                                    for k in sorted(st.evals)]})

    def mean(key: str) -> float | None:
        xs = [float(v) for p in per if (v := p[key]) is not None]
        return float(np.mean(xs)) if xs else None

    return {"arm": label, "protocol": protocol, "router": router,
            "capacity_req_s": float(np.mean([p["capacity_req_s"] for p in per])),
            "capacity_scale": float(np.mean([p["capacity_scale"] for p in per])),
            "windows_met": sum(p["met"] for p in per),
            "windows_capped": sum(p["capped"] for p in per),
            "tpot_p95_ms": mean("tpot_p95_ms"), "ttft_p95_s": mean("ttft_p95_s"),
            "barrier_idle_share": mean("barrier_idle_share"), "per_window": per}


def paired_ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Mean and 95% t-interval of ``cap_a,w / cap_b,w - 1`` over the windows where
    ``b`` has a capacity (None where none has)."""
    bw = {p["window"]: p["capacity_scale"] for p in b["per_window"]}
    d = [p["capacity_scale"] / bw[p["window"]] - 1.0 for p in a["per_window"]
         if bw.get(p["window"], 0.0) > 0]
    if not d:
        return None
    return paired(d).as_dict()


def _compare(rows: list[dict[str, Any]]) -> None:
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        mine = [r for r in rows if r["protocol"] == protocol]
        routers = [r for r in mine if r["router"] != "graph"]
        rr = next((r for r in routers if r["arm"].endswith(":round_robin")), None)
        best = max(routers, key=lambda r: r["capacity_req_s"], default=None)
        for r in mine:
            r["best_router"] = best["arm"] if best else None
            if rr is not None and r is not rr:
                r["vs_round_robin"] = paired_ratio(r, rr)
            if r["router"] == "graph" and best is not None:
                r["vs_best_router"] = paired_ratio(r, best)
