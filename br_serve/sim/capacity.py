"""Capacity at a latency SLO: the highest request rate a cluster carries within it.

For each spec, a bisection over the arrival-rate scale ``s`` (arrivals divided by ``s``;
``s = 2`` is twice the trace's request rate) finds the largest ``s`` at which the
**ensemble means** over the K paired replays of TPOT P95 and TTFT P95 both meet the SLO.
The rate is reported as ``capacity_req_s = s * base_req_s``, where ``base_req_s`` is the
mean over the replays of ``(n - 1) / duration`` at scale 1 (replays are perturbed at the
recorded rate, then scaled).

Search (:class:`Bracket`): the bracket ``[lo, hi]`` in requests per second (default
``hi`` = the cluster's token bound ``G * B / min(b)`` divided by the replays' mean
output, which no policy can exceed; ``lo = hi / lo_fraction``). The bisection is
geometric (midpoint ``sqrt(lo * hi)``) and stops when ``hi / lo - 1 <= rel_tol``; the
answer is ``lo``, the highest rate seen to meet the SLO. The ends are evaluated only
when the answer reaches them: if ``hi`` meets the SLO the capacity is reported as
``hi`` with ``capped = True``; if ``lo`` fails, the capacity is 0 and ``note`` says
whether no rate at all can meet the SLO (it asks for less than one unloaded step, or
less than one prefill plus one step) or only none in the bracket. The search assumes the
SLO metrics grow with the rate; with noise the answer is one crossing of the
ensemble-mean curve, resolved to ``rel_tol``. All specs advance together, one parallel
batch (specs x replays) per round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from br_serve.sim.ensemble import check_baseline, cluster_key, engine_options
from br_serve.sim.replays import Replay, make_replays
from br_serve.sim.runner import Runner, RunSpec, Task
from br_serve.traces import Trace


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objective: ensemble-mean TPOT P95 and TTFT P95 at or below these."""

    tpot_p95_ms: float
    ttft_p95_s: float

    def __post_init__(self) -> None:
        if not self.tpot_p95_ms > 0:
            raise ValueError(f"slo_tpot_p95_ms: must be > 0 (got {self.tpot_p95_ms})")
        if not self.ttft_p95_s > 0:
            raise ValueError(f"slo_ttft_p95_s: must be > 0 (got {self.ttft_p95_s})")


@dataclass(frozen=True, slots=True)
class Bracket:
    """The search interval and resolution (see the module docstring)."""

    lo_req_s: float | None = None
    hi_req_s: float | None = None
    lo_fraction: float = 16.0
    rel_tol: float = 0.02
    max_rounds: int = 40

    def __post_init__(self) -> None:
        if self.lo_req_s is not None and not self.lo_req_s > 0:
            raise ValueError(f"rate_lo_req_s: must be > 0 (got {self.lo_req_s})")
        if self.hi_req_s is not None and not self.hi_req_s > 0:
            raise ValueError(f"rate_hi_req_s: must be > 0 (got {self.hi_req_s})")
        if (self.lo_req_s is not None and self.hi_req_s is not None
                and self.lo_req_s >= self.hi_req_s):
            raise ValueError(f"rate_lo_req_s: {self.lo_req_s} must be below rate_hi_req_s "
                             f"{self.hi_req_s}")
        if not self.lo_fraction > 1:
            raise ValueError(f"lo_fraction: must be > 1 (got {self.lo_fraction})")
        if not 0 < self.rel_tol < 1:
            raise ValueError(f"rate_tol: must be in (0, 1) (got {self.rel_tol})")


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """``runs``: one row per spec (capacity and the metrics at it, ``evaluations``: every
    rate tried); ``meta``: the SLO, bracket, replays and base rate."""

    runs: list[dict[str, Any]]
    meta: dict[str, Any]

    def row(self, label: str) -> dict[str, Any]:
        for r in self.runs:
            if r["label"] == label:
                return r
        raise KeyError(label)

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, **self.meta}


def _floor_note(spec: RunSpec, slo: SLO) -> str | None:
    """Why no rate at all can meet ``slo`` on this cluster, or None."""
    c = spec.config
    b = float(c.step_model().arrays(c.replicas)[1].min())
    if 1e3 * b > slo.tpot_p95_ms:
        return (f"no rate can meet the SLO: every decode step takes at least "
                f"b = {1e3 * b:g} ms > TPOT P95 {slo.tpot_p95_ms:g} ms")
    if not c.sim.saturated and c.prefill.p0_s + b > slo.ttft_p95_s:
        return (f"no rate can meet the SLO: one prefill plus one step take at least "
                f"{c.prefill.p0_s + b:g} s > TTFT P95 {slo.ttft_p95_s:g} s")
    return None


def plan_search(trace: Trace, specs: Sequence[RunSpec], br: Bracket, *, baseline: str,
                replays: int, replay_mode: str, limit: int | None, jitter_ms: float,
                seed: int) -> tuple[list[Replay], float, dict[int, float], dict[int, float]]:
    """The replays, the base rate (req/s at scale 1) and each spec's bracket ends
    ``(lo, hi)`` in req/s, shared by the pooled and the per-replay search.

    Raises:
        ValueError: saturated specs, bad replay arguments, an unknown baseline.
    """
    if any(s.config.sim.saturated for s in specs):
        raise ValueError("sim.saturated: capacity needs trace-timed runs (arrival times)")
    check_baseline(specs, baseline)
    reps = make_replays(trace, replay_mode, replays, limit=limit, seed=seed,
                        jitter_ms=jitter_ms)
    rates = [(len(r.trace) - 1) / r.trace.duration_s for r in reps if r.trace.duration_s > 0]
    if not rates:
        raise ValueError("trace: all arrivals at one instant; capacity needs arrival times")
    base = float(np.mean(rates))
    mean_out = float(np.mean([r.trace.output_tokens.mean() for r in reps]))
    hi0: dict[int, float] = {}
    for i, s in enumerate(specs):
        c = s.config
        b = float(c.step_model().arrays(c.replicas)[1].min())
        bound = c.replicas * c.slots / max(b, 1e-9) / mean_out
        hi0[i] = br.hi_req_s if br.hi_req_s is not None else bound
    lo0 = {i: br.lo_req_s if br.lo_req_s is not None else hi0[i] / br.lo_fraction
           for i in hi0}
    return reps, base, lo0, hi0


def capacity(trace: Trace, specs: Sequence[RunSpec], slo: SLO, *, replays: int = 8,
             replay_mode: str = "jitter", limit: int | None = None,
             jitter_ms: float = 50.0, seed: int = 0, baseline: str = "jsq",
             bracket: Bracket | None = None, warm_start: Trace | None = None,
             jobs: int | None = None,
             progress: Callable[[str], None] | None = None) -> CapacityResult:
    """Capacity at ``slo`` of every spec (trace-timed), by bisection on the rate.

    Raises:
        ValueError: saturated specs (capacity needs arrival times), bad replay
            arguments, a baseline that is not among the specs (named fields).
    """
    br = bracket or Bracket()
    reps, base, lo0, hi0 = plan_search(trace, specs, br, baseline=baseline,
                                       replays=replays, replay_mode=replay_mode,
                                       limit=limit, jitter_ms=jitter_ms, seed=seed)
    state = {i: RateSearch(lo0[i], hi0[i]) for i in hi0}
    with Runner(specs, reps, warm_start=warm_start, jobs=jobs) as runner:
        for rnd in range(br.max_rounds):
            nxt = {i: st.next_rate(br.rel_tol) for i, st in state.items()}
            todo = {i: r for i, r in nxt.items() if r is not None}
            if not todo:
                break
            tasks = [Task(i, rep.index, rate / base) for i, rate in todo.items()
                     for rep in reps]
            rows = runner.run(tasks)
            for j, (i, rate) in enumerate(todo.items()):
                state[i].record(rate, rows[j * len(reps):(j + 1) * len(reps)], slo)
            if progress is not None:
                progress(f"round {rnd + 1}: " + ", ".join(
                    f"{specs[i].name} {r:.3g} req/s ({_brief(state[i].evals[r])})"
                    for i, r in todo.items()))
    runs = [state[i].result(specs[i], slo, br) for i in range(len(specs))]
    for r, s in zip(runs, specs, strict=True):
        bidx = next((b for b, bs in enumerate(specs) if bs.name == baseline
                     and cluster_key(bs.config) == cluster_key(s.config)), None)
        bcap = runs[bidx]["capacity_req_s"] if bidx is not None else None
        r["baseline"] = baseline if bidx is not None else None
        r["capacity_vs_baseline"] = (r["capacity_req_s"] / bcap - 1.0 if bcap else None)
    meta = {"slo": {"tpot_p95_ms": slo.tpot_p95_ms, "ttft_p95_s": slo.ttft_p95_s},
            "bracket": {"lo_req_s": br.lo_req_s, "hi_req_s": br.hi_req_s,
                        "lo_fraction": br.lo_fraction, "rel_tol": br.rel_tol},
            "base_req_s": base, "replays": len(reps), "replay_mode": replay_mode,
            "baseline": baseline}
    return CapacityResult(runs, meta)


class RateSearch:
    """Geometric bisection state of one spec: ``lo`` assumed (or seen) to meet the SLO,
    ``hi`` assumed (or seen) to fail; the ends are checked only when the answer reaches
    them."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi
        self.lo0, self.hi0 = lo, hi
        self.evals: dict[float, dict[str, Any]] = {}
        self.failed_lo = False

    def next_rate(self, tol: float) -> float | None:
        if self.failed_lo:
            return None
        if self.hi / self.lo - 1.0 > tol:
            return math.sqrt(self.lo * self.hi)
        if self.lo == self.lo0 and self.lo0 not in self.evals:
            return self.lo0
        if self.hi == self.hi0 and self.hi0 not in self.evals:
            return self.hi0
        return None

    def record(self, rate: float, rows: list[dict[str, Any]], slo: SLO) -> None:
        tpot = _mean([r.get("tpot_p95_ms") for r in rows])
        ttft_ms = _mean([r.get("ttft_p95_ms") for r in rows])
        ttft = None if ttft_ms is None else ttft_ms / 1e3
        meets = (tpot is not None and ttft is not None and tpot <= slo.tpot_p95_ms
                 and ttft <= slo.ttft_p95_s)
        self.evals[rate] = {
            "req_s": rate, "tpot_p95_ms": tpot, "ttft_p95_s": ttft, "meets": meets,
            "throughput_tok_s": _mean([r.get("throughput_tok_s") for r in rows]),
            "barrier_idle_share": _mean([r.get("barrier_idle_share") for r in rows]),
        }
        if rate == self.hi0 and meets:
            self.lo = self.hi = rate  # capped: the top of the bracket meets the SLO
        elif rate == self.lo0 and not meets:
            self.failed_lo = True
        elif meets:
            self.lo = rate
        else:
            self.hi = rate

    def result(self, spec: RunSpec, slo: SLO, br: Bracket) -> dict[str, Any]:
        c = spec.config
        row: dict[str, Any] = {"label": spec.name, "policy": c.policy.name,
                               "predictor": c.predictor.name, "replicas": c.replicas,
                               "slots": c.slots, "policy_options": dict(c.policy.options),
                               "engine_options": engine_options(c),
                               "rate_lo_req_s": self.lo0, "rate_hi_req_s": self.hi0,
                               "rel_tol": br.rel_tol}
        at = self.evals.get(self.lo)
        if self.failed_lo or at is None:
            why = _floor_note(spec, slo) or (
                f"the SLO is not met even at the bracket's low end {self.lo0:.4g} req/s; "
                f"lower rate_lo_req_s to search below it")
            at0 = self.evals.get(self.lo0, {})
            row.update(capacity_req_s=0.0, met=False, capped=False, note=why,
                       tpot_p95_ms=at0.get("tpot_p95_ms"), ttft_p95_s=at0.get("ttft_p95_s"))
        else:
            capped = self.lo == self.hi0
            row.update(capacity_req_s=self.lo, met=True, capped=capped,
                       note=(f"the bracket's top {self.hi0:.4g} req/s meets the SLO: the "
                             f"capacity is at least that; raise rate_hi_req_s"
                             if capped else None),
                       tpot_p95_ms=at["tpot_p95_ms"], ttft_p95_s=at["ttft_p95_s"],
                       throughput_tok_s=at["throughput_tok_s"],
                       barrier_idle_share=at["barrier_idle_share"])
        row["ttft_p95_ms"] = (None if row.get("ttft_p95_s") is None
                              else 1e3 * row["ttft_p95_s"])
        row["evaluations"] = [self.evals[k] for k in sorted(self.evals)]
        return row


def _brief(e: dict[str, Any]) -> str:
    """One evaluation for the progress line: TPOT P95, TTFT P95, barrier idle, verdict."""
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    return (f"TPOT {f(e['tpot_p95_ms'], '.1f')} ms, TTFT {f(e['ttft_p95_s'], '.2f')} s, "
            f"idle {f(e['barrier_idle_share'], '.2f')}, {'meets' if e['meets'] else 'fails'}")


def _mean(vals: list[Any]) -> float | None:
    xs = [float(v) for v in vals if v is not None]
    return float(np.mean(xs)) if xs and len(xs) == len(vals) else None
