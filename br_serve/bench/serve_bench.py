"""``bench-serve``: replay a trace against the live HTTP endpoint, beside the simulator.

For each planned run (a policy, or a named variant of one with its own options: see
:func:`br_serve.config.plan.plan_policy_runs`): deploy the graph (emulated engine, G
replicas, one set of step coefficients per replica if given), replay the trace's
requests at their (time-scaled) arrival times as streaming ``/v1/completions`` calls,
check every stream token by token against the emulated engine's deterministic output
(lost requests, duplicated or missing tokens), read the barrier-measured counters and
(for a policy that calibrates step costs online) the fitted step coefficients from the
scheduler; ``repeats`` times, runs interleaved. Then simulate the same trace and
configuration (exact and jittered, :mod:`br_serve.bench.serve_report`). Writes one JSON.

Conventions shared with the simulator: a trace request with output ``o`` is sent with
``max_tokens = o + 1`` (the prefill token plus ``o`` decode steps, the simulator's ``o``);
throughput is decode tokens per second of busy decode time (steps with work), measured
at the barrier; the client's wall-clock throughput is reported too.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.config.plan import PolicyRun
from br_serve.engine.emulated import token_id, token_text
from br_serve.serve.config import GraphConfig

MODEL = "br-emulated"


@dataclass
class _Req:
    index: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    seed: int
    status: int = 0
    sent_s: float = 0.0
    first_s: float = 0.0
    second_s: float = 0.0
    last_s: float = 0.0
    tokens: int = 0
    bad_tokens: int = 0
    error: str | None = None


async def _one(client: Any, r: _Req, t0: float, model: str = MODEL) -> None:
    delay = t0 + r.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    r.sent_s = time.perf_counter() - t0
    # a distinct first word: no two prompts share a prefix (prefix-aware routers would
    # otherwise see one endless shared prefix); the word count is the prompt length
    words = [f"r{r.seed}"] + ["w"] * (r.prompt_tokens - 1)
    payload = {"model": model, "prompt": " ".join(words),
               "max_tokens": r.max_tokens, "seed": r.seed, "stream": True}
    expected = [token_text(token_id(r.seed, r.prompt_tokens + i))
                for i in range(r.max_tokens)]
    got: list[str] = []
    try:
        async with client.stream("POST", "/v1/completions", json=payload) as resp:
            r.status = resp.status_code
            if resp.status_code != 200:
                r.error = (await resp.aread()).decode()[:200]
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    r.error = ev["error"]["message"]
                    continue
                for ch in ev.get("choices", []):
                    if ch.get("text"):
                        now = time.perf_counter() - t0
                        if not got:
                            r.first_s = now
                        elif len(got) == 1:
                            r.second_s = now
                        r.last_s = now
                        got.append(ch["text"])
    except Exception as exc:  # a transport failure is a lost request, not a crash
        r.error = f"{type(exc).__name__}: {exc}"
    r.tokens = len(got)
    # duplicated, missing or wrong tokens: positions that differ from the exact sequence
    r.bad_tokens = sum(a != b for a, b in zip(got, expected, strict=False)) + abs(
        len(got) - len(expected))


async def _replay(port: int, reqs: list[_Req], timeout_s: float, model: str = MODEL
                  ) -> float:
    """Send every request at its arrival time (streaming) to 127.0.0.1:``port``; the
    wall seconds from the first send to the last answer."""
    import httpx

    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s,
                                 limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(client, r, t0, model) for r in reqs))
        return time.perf_counter() - t0


def _replica_cpu(cfg: GraphConfig) -> list[dict[str, float]]:
    """Every decode replica actor's process CPU seconds and steps so far."""
    import ray

    from br_serve.serve.actors import actor_names

    _, names = actor_names(cfg.serve.app_name, cfg.replicas)
    out: list[dict[str, float]] = ray.get(
        [ray.get_actor(n, namespace=cfg.serve.namespace).proc_stats.remote() for n in names])
    return out


def _cpu_costs(before: list[dict[str, float]], after: list[dict[str, float]],
               engine_before: dict[str, float] | None,
               engine_after: dict[str, float] | None) -> dict[str, Any]:
    """CPU per step of the decode replica actors over the replay, and with a remote
    engine per step *of the engine* (the proxy overhead) beside the emulator's own."""
    cpu = [a["cpu_s"] - b["cpu_s"] for a, b in zip(after, before, strict=True)]
    steps = [a["steps"] - b["steps"] for a, b in zip(after, before, strict=True)]
    out: dict[str, Any] = {
        "replica_cpu_s": cpu,
        "replica_cpu_ms_per_step": float(np.mean([c / s * 1e3 for c, s in
                                                  zip(cpu, steps, strict=True) if s > 0]))
        if any(steps) else None}
    if engine_before is not None and engine_after is not None:
        n = engine_after["steps"] - engine_before["steps"]
        out["engine_steps"] = n
        out["proxy_cpu_ms_per_engine_step"] = float(np.mean(cpu)) / n * 1e3 if n else None
        out["engine_cpu_ms_per_step"] = ((engine_after["process_cpu_s"]
                                          - engine_before["process_cpu_s"]) / n * 1e3
                                         if n else None)
        out["engine_overrun_s"] = engine_after["overrun_s"] - engine_before["overrun_s"]
    return out


def _measure(cfg: GraphConfig, reqs: list[_Req], timeout_s: float,
             engine: str = "emulated") -> dict[str, Any]:
    """One live run; ``engine`` ``vllm`` / ``sglang``: through engine emulators
    (:mod:`br_serve.bench.remote_engines`) instead of the built-in emulated engine."""
    if engine == "emulated":
        return _measure_graph(cfg, reqs, timeout_s, None)
    from br_serve.bench.remote_engines import emulated_engines

    with emulated_engines(cfg, engine) as (remote, decode_url):
        return _measure_graph(remote, reqs, timeout_s, decode_url)


def _measure_graph(cfg: GraphConfig, reqs: list[_Req], timeout_s: float,
                   decode_url: str | None) -> dict[str, Any]:
    from ray import serve

    from br_serve.bench.remote_engines import engine_counters
    from br_serve.serve.graph import deploy

    handle = deploy(cfg)
    handle.reset_stats.remote().result()
    cpu0 = _replica_cpu(cfg)
    eng0 = engine_counters(decode_url) if decode_url else None
    wall = asyncio.run(_replay(cfg.serve.port, reqs, timeout_s))
    stats = handle.stats.remote().result()
    state = handle.state.remote().result()
    costs = _cpu_costs(cpu0, _replica_cpu(cfg), eng0,
                       engine_counters(decode_url) if decode_url else None)
    serve.delete(cfg.serve.app_name)
    ok = [r for r in reqs if r.status == 200 and r.error is None and r.bad_tokens == 0]
    # decode-phase TPOT, as the simulator's: from the first decode token (index 1; index
    # 0 comes from prefill, before the pool wait) to the last
    tpot = [(r.last_s - r.second_s) / (r.tokens - 2) for r in ok if r.tokens >= 3]
    ttft = [r.first_s - r.sent_s for r in ok]
    gen = sum(r.tokens for r in reqs)
    step = stats["mean_step_s"]
    td_per_step = stats["tick_dispatch_s_total"] / stats["steps"] if stats["steps"] else 0.0
    return {
        "throughput_tok_s": stats["throughput_tok_s"],
        "model_throughput_tok_s": stats["model_throughput_tok_s"],
        "wall_throughput_tok_s": gen / wall if wall > 0 else None,
        "tpot_p50_ms": float(np.percentile(tpot, 50) * 1e3) if tpot else None,
        "tpot_p95_ms": float(np.percentile(tpot, 95) * 1e3) if tpot else None,
        "ttft_p50_ms": float(np.percentile(ttft, 50) * 1e3) if ttft else None,
        "mean_imbalance_tokens": stats["mean_imbalance_tokens"],
        "mean_step_ms": step * 1e3,
        "busy_steps": stats["steps"],
        "busy_s": stats["busy_s"],
        "model_busy_s": stats["model_busy_s"],
        "mean_replica_load_tokens": stats["mean_replica_load_tokens"],
        "mean_replica_running": stats["mean_replica_running"],
        # the step coefficients the policy saw at the end (fitted online, or configured)
        "step_coefficients": state["step_coefficients"],
        "step_fit": ([r["step"] for r in state["replicas"]]
                     if state["step_coefficients"] == "calibrated" else None),
        "requests": len(reqs),
        "requests_lost": len(reqs) - len(ok),
        "bad_tokens": sum(r.bad_tokens for r in reqs),
        "errors": sorted({r.error for r in reqs if r.error})[:5],
        "tick_dispatch_ms_p50": stats["tick_dispatch_ms_p50"],
        "tick_dispatch_ms_p99": stats["tick_dispatch_ms_p99"],
        "tick_dispatch_share_of_step": td_per_step / step if step else None,
        "wall_s": wall,
        **costs,
    }


def slowed(base: GraphConfig, replicas: list[int], factor: float) -> GraphConfig:
    """``base`` whose emulated engines of ``replicas`` run ``factor`` times slower (all
    of ``a``, ``b``, ``c``) than the configured step model says: a heterogeneous cluster
    the operator did not describe (``engine.step_factor``), e.g. half the replicas
    1.5x slower. Only a policy that calibrates online sees it; the simulator runs it as
    a drift from step 0. Repeated calls multiply.

    Raises:
        ValueError: a replica out of range or a factor that is not positive.
    """
    from br_serve.core.step import per_replica
    from br_serve.serve.config import parse_graph_config

    g = base.replicas
    bad = [r for r in replicas if not 0 <= r < g]
    if bad or factor <= 0:
        raise ValueError(f"--slow: replicas must lie in 0..{g - 1} and the factor be > 0 "
                         f"(got {replicas}, {factor})")
    f = np.asarray(per_replica(base.engine.step_factor, g), dtype=np.float64)
    f[replicas] *= factor
    return parse_graph_config(base, engine_step_factor=tuple(float(x) for x in f))


def load_workload(trace_path: str | None, limit: int, arrival_scale: float,
                  max_output: int, max_prompt: int, seed: int) -> Any:
    """The replayed trace: a file (first ``limit`` requests) or a seeded synthetic one.

    Outputs are clipped to ``max_output`` and prompts to ``max_prompt`` (not dropped),
    so the replay stays short; arrivals are multiplied by ``arrival_scale``.
    """
    from br_serve.traces import SyntheticSpec, Trace, load_trace, synthetic_trace

    if trace_path:
        tr = load_trace(trace_path, limit=limit)
    else:
        tr = synthetic_trace(SyntheticSpec(requests=limit, seed=seed))
    return Trace.build(np.asarray(tr.arrival_s) * arrival_scale,
                       np.clip(tr.input_tokens, 1, max_prompt),
                       np.clip(tr.output_tokens, 1, max_output))


def plan_runs(base: GraphConfig, entries: list[str], options: dict[str, Any]
              ) -> list[tuple[PolicyRun, GraphConfig]]:
    """Every planned run with its validated graph configuration (``base`` with the run's
    policy, options and predictor; app name ``bench_<label>``).

    Raises:
        ConfigError: a bad entry or an option no listed policy has (named).
        GraphConfigError: a run's configuration is invalid (named field).
    """
    from br_serve.config.plan import plan_policy_runs
    from br_serve.serve.config import parse_graph_config

    out = []
    for run in plan_policy_runs(entries, options):
        cfg = parse_graph_config(base, policy=run.policy,
                                 policy_options=run.options, predictor=run.predictor,
                                 serve_app_name=f"bench_{run.label.replace('+', '_')}")
        out.append((run, cfg))
    return out


def run_bench(base: GraphConfig, runs_planned: list[tuple[PolicyRun, GraphConfig]],
              trace: Any, out: Path, timeout_s: float = 600.0, repeats: int = 1,
              jitter_s: float = 0.05, seeds: int = 16,
              workload: dict[str, Any] | None = None, overhead_from: str = "baseline",
              baseline: str = "jsq", engine: str = "emulated") -> dict[str, Any]:
    """Measure every planned run ``repeats`` times (interleaved: jsq, br0, ..., jsq,
    br0, ... so slow drifts of the host hit all policies alike), simulate each (see
    :mod:`br_serve.bench.serve_report`), print a table, write ``out`` (JSON). Gains are
    over the run labelled ``baseline``. ``workload`` (the arguments that rebuilt
    ``trace``) is stored for ``--resimulate``. ``engine``: ``emulated`` (built in) or
    ``vllm`` / ``sglang`` (the graph proxies engine emulators with the same step
    model)."""
    runs: list[dict[str, Any]] = []
    for rep in range(repeats):
        for run, cfg in runs_planned:
            pol = run.label
            reqs = [_Req(i, float(trace.arrival_s[i]), int(trace.input_tokens[i]),
                         int(trace.output_tokens[i]) + 1, 10_000 + i)
                    for i in range(len(trace))]
            t = time.perf_counter()
            meas = _measure(cfg, reqs, timeout_s, engine)
            runs.append({"policy": pol, "policy_name": run.policy,
                         "policy_options": run.options, "predictor": run.predictor,
                         "repeat": rep, "measured": meas})
            print(f"{pol} (run {rep + 1}/{repeats}): {time.perf_counter() - t:.0f}s: "
                  f"{json.dumps({k: meas.get(k) for k in _PROGRESS_KEYS})}", flush=True)
    result = {"config": base.model_dump(exclude={"serve": {"api_key"},
                                                 "remote": {"api_key"}}), "engine": engine,
              "workload": workload or {},
              "requests": len(trace), "repeats": repeats, "sim_jitter_s": jitter_s,
              "sim_seeds": seeds, "baseline": baseline, "runs": runs}
    return report(result, trace, base, out, overhead_from)


def report(result: dict[str, Any], trace: Any, base: GraphConfig, out: Path,
           overhead_from: str = "baseline") -> dict[str, Any]:
    """Simulate beside the measured ``result["runs"]``, print the table, write ``out``."""
    from br_serve.bench.serve_report import format_table, resimulate

    result = resimulate(result, trace, base, overhead_from)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(format_table(result))
    return result


_PROGRESS_KEYS = ("throughput_tok_s", "model_throughput_tok_s", "mean_imbalance_tokens",
                  "requests_lost", "bad_tokens", "replica_cpu_ms_per_step",
                  "proxy_cpu_ms_per_engine_step", "engine_cpu_ms_per_step")
