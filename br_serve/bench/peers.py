"""``bench-peers``: BalanceRoute's graph against the field's real routers, same engines.

For every trace window (``replay_mode = window`` of :mod:`br_serve.sim.replays`: K
windows of N requests spread over the trace, the same windows for every arm: paired)
and every arm (a real router with one decode rule, :mod:`br_serve.bench.peers_routers`,
or the graph with its default policy routing ``engine=vllm|sglang``), start a FRESH
prefill and decode emulator (:func:`br_serve.bench.remote_engines.engine_processes`: one
step model for all arms, ``engine.slowdown`` applied), the router or the graph in front, and
replay the window's requests as streaming completions (saturated: all at t = 0; timed:
the window's arrivals divided by ``rate_scale``). Every stream is checked token by token
(lost, wrong or missing tokens are counted). Measured per run:

- client side (what users see): ``output_tok_s`` = output tokens / (last token - first
  send); ``tpot_p50/p95_ms`` (decode phase: from the second token to the last);
  ``ttft_p50/p95_ms``;
- engine side, from the decode emulator's step log over the replay's steps
  (:func:`br_serve.emulator.steplog.summarise_rows`): ``tokens_per_busy_s`` (the
  simulator's throughput definition), ``mean_imbalance_tokens``, ``mean_max_load_tokens``,
  ``barrier_idle_share``, ``mean_running`` per rank, ``mean_step_ms``.

Then paired gains over ``round_robin`` of each protocol and of the graph over the best
real router (:mod:`br_serve.bench.peers_report`), capacity at an SLO per window by
bisection on the arrival rate (:mod:`br_serve.bench.peers_capacity`), and the simulator
on the same windows with the policy that claims to model each rule (``sim_policy``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.bench.peers_routers import Arm, running_router
from br_serve.bench.remote_engines import (
    REMOTE_MODEL,
    _free_port,
    engine_processes,
    engine_steps,
)
from br_serve.bench.serve_bench import _measure_graph, _replay, _Req
from br_serve.emulator.steplog import summarise_rows
from br_serve.serve.config import GraphConfig, parse_graph_config


@dataclass(frozen=True, slots=True)
class Window:
    """One replayed window: its index, start row in the trace, and requests
    ``(arrival_s from 0, prompt_tokens, output_tokens)``."""

    index: int
    start: int
    arrival_s: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]

    def requests(self, saturated: bool, rate_scale: float = 1.0) -> list[_Req]:
        """Fresh request records: ``max_tokens = o + 1`` (bench-serve's convention: the
        prefill token plus ``o`` decode steps); seeds fixed per row so every arm gets
        the same tokens."""
        return [_Req(i, 0.0 if saturated else a / rate_scale, p, o + 1,
                     10_000 + self.start + i)
                for i, (a, p, o) in enumerate(zip(self.arrival_s, self.prompt_tokens,
                                                  self.output_tokens, strict=True))]

    @property
    def rate_req_s(self) -> float:
        span = self.arrival_s[-1] - self.arrival_s[0]
        return (len(self.arrival_s) - 1) / span if span > 0 else float("inf")


def windows(trace_path: str, k: int, n: int, max_prompt: int, max_output: int,
            seed: int = 0) -> list[Window]:
    """K windows of ``n`` requests (clipped prompts and outputs) of the trace file."""
    from br_serve.sim.replays import make_replays
    from br_serve.traces import load_trace

    tr = load_trace(trace_path)
    out = []
    for rep in make_replays(tr, "window", k, limit=n, seed=seed):
        t = rep.trace
        arr = np.asarray(t.arrival_s, dtype=float)
        out.append(Window(rep.index, rep.start, tuple(float(x) for x in arr - arr[0]),
                          tuple(int(x) for x in np.clip(t.input_tokens, 1, max_prompt)),
                          tuple(int(x) for x in np.clip(t.output_tokens, 1, max_output))))
    return out


def client_metrics(reqs: Sequence[_Req]) -> dict[str, Any]:
    """What the replay's clients saw (see the module docstring)."""
    ok = [r for r in reqs if r.status == 200 and r.error is None and r.bad_tokens == 0]
    tpot = [(r.last_s - r.second_s) / (r.tokens - 2) for r in ok if r.tokens >= 3]
    ttft = [r.first_s - r.sent_s for r in ok]
    first = min((r.sent_s for r in reqs), default=0.0)
    last = max((r.last_s for r in reqs), default=0.0)
    tokens = sum(r.tokens for r in reqs)

    def pct(xs: list[float], q: float) -> float | None:
        return float(np.percentile(xs, q) * 1e3) if xs else None

    return {"output_tok_s": tokens / (last - first) if last > first else None,
            "output_tokens": tokens, "makespan_s": last - first,
            "tpot_p50_ms": pct(tpot, 50), "tpot_p95_ms": pct(tpot, 95),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
            "requests": len(reqs), "requests_lost": len(reqs) - len(ok),
            "bad_tokens": sum(r.bad_tokens for r in reqs),
            "errors": sorted({r.error for r in reqs if r.error})[:3]}


def engine_metrics(decode_url: str, since: int) -> dict[str, Any]:
    """The decode emulator's barrier over its steps from ``since`` on, its ignored
    request fields and its refusals."""
    import httpx

    log = engine_steps(decode_url, since)
    model = log["step_model"]
    out = summarise_rows(log["rows"], model["a_s_per_token"], model["b_s"])
    st = httpx.get(f"{decode_url}/emulator/stats", timeout=30).json()
    out["ignored_fields"] = st.get("ignored_fields", {})
    out["refused"] = st.get("refused", {})
    return out


def _steps_now(decode_url: str) -> int:
    import httpx

    return int(httpx.get(f"{decode_url}/emulator/barrier", timeout=30).json()["steps"])


def run_arm(arm: Arm, protocol: str, base: GraphConfig, reqs: list[_Req],
            timeout_s: float, log_dir: Path | None = None) -> dict[str, Any]:
    """One live run of ``arm`` on fresh engines; ``protocol`` matters for the graph."""
    t = time.perf_counter()
    with engine_processes(base, protocol) as (purl, durl):
        if arm.router == "graph":
            remote = parse_graph_config(base, engine=protocol,
                                        remote_prefill_urls=purl, remote_decode_urls=durl,
                                        remote_dp_size=base.replicas,
                                        remote_model=REMOTE_MODEL,
                                        serve_app_name=f"peers_{protocol}")
            since = _steps_now(durl)
            graph = _measure_graph(remote, reqs, timeout_s, durl)
            extra = {"graph": {k: graph.get(k) for k in _GRAPH_KEYS}}
        else:
            port = _free_port()
            log = log_dir / f"{arm.label.replace(':', '_')}.log" if log_dir else None
            with running_router(arm, port, purl, durl, base.replicas, REMOTE_MODEL,
                                log) as _:
                since = _steps_now(durl)
                asyncio.run(_replay(port, reqs, timeout_s, REMOTE_MODEL))
            extra = {}
        eng = engine_metrics(durl, since)
    return {**client_metrics(reqs), "engine": eng, **extra,
            "run_wall_s": time.perf_counter() - t}


_GRAPH_KEYS = ("mean_imbalance_tokens", "throughput_tok_s", "tick_dispatch_ms_p50",
               "tick_dispatch_ms_p99", "replica_cpu_ms_per_step",
               "proxy_cpu_ms_per_engine_step")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one bench-peers invocation measures (validated by the CLI)."""

    base: GraphConfig
    arms: tuple[tuple[str, Arm], ...]  # (protocol, arm)
    windows: tuple[Window, ...]
    saturated: bool
    timed_scales: tuple[float, ...]  # rate multipliers for timed replays (may be empty)
    timeout_s: float


def run_plan(plan: Plan, progress: Callable[[str], None] = print,
             log_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every (window, mode, arm) run, windows outermost and arms interleaved inside, so
    that slow drifts of the host hit every arm alike."""
    modes: list[tuple[str, float]] = ([("saturated", 1.0)] if plan.saturated else [])
    modes += [("timed", s) for s in plan.timed_scales]
    rows = []
    for w in plan.windows:
        for mode, scale in modes:
            for protocol, arm in plan.arms:
                reqs = w.requests(mode == "saturated", scale)
                try:
                    m = run_arm(arm, protocol, plan.base, reqs, plan.timeout_s, log_dir)
                except Exception as exc:  # one failed run is recorded, not fatal
                    m = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
                rows.append({"arm": arm.label, "protocol": protocol, "router": arm.router,
                             "rule": arm.rule, "sim_policy": arm.sim_policy,
                             "dp_aware": arm.starts_dp_aware,
                             "window": w.index, "window_start": w.start, "mode": mode,
                             "rate_scale": scale, "measured": m})
                progress(f"window {w.index} {mode} x{scale:g} {protocol} {arm.label}: "
                         + json.dumps({k: _short(m.get(k)) for k in _PROGRESS}))
    return rows


_PROGRESS = ("output_tok_s", "tpot_p95_ms", "ttft_p50_ms", "requests_lost", "bad_tokens",
             "run_wall_s", "failed")


def _short(v: Any) -> Any:
    return round(v, 1) if isinstance(v, float) else v
