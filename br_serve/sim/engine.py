"""The discrete-event decode simulator (DESIGN section 7).

Time advances by decode steps. Between two *events* (a request finishes; a prefill
lands in the pool while a slot is free) nothing a policy could see changes except that
every running request grows by one token per step, so the loop jumps over such a
stretch in one vectorised go: loads are ``L_g(k+j) = L_g(k) + N_g j`` and the step
times, maxima and imbalances of the whole stretch are computed with numpy.

Conventions (see docs/simulator.md):
- A request with output ``o`` runs ``o`` decode steps after admission and produces one
  token at the end of each; its load during its ``j``-th step is ``s + j`` (j from 0).
- The policy ticks at a step boundary when the pool is non-empty, a slot is free and
  something changed since its last tick (a finish, a delivery into the pool). A tick
  that assigns nothing waits for the next change.
- The policy context gets a frozen clock, so BR-H's predictor timeout never fires and
  results do not depend on machine load; the tick's wall time is measured separately.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from br_serve.core import (
    FinishedRequests,
    PolicyContext,
    PoolRequest,
    PromptPool,
    TerminationPredictor,
    make_policy,
    parse_policy_config,
)
from br_serve.core.state import ClusterState
from br_serve.sim.config import SimConfig
from br_serve.sim.feed import BacklogFeeder, PrefillFeeder
from br_serve.sim.predict import build_predictor
from br_serve.sim.result import SimResult, StepSeries
from br_serve.traces import Trace

_NEVER = np.iinfo(np.int64).max


def _prefix_hashes(trace: Trace) -> list[int]:
    if trace.hash_ids is None:
        return [-1] * len(trace)
    # Hash of the whole block list; tuples of ints hash the same in every process.
    return [hash(h) & ((1 << 62) - 1) if h else -1 for h in trace.hash_ids]


class _Steps:
    """Accumulates per-step columns, one numpy chunk per stretch."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[np.ndarray]] = {
            k: [] for k in ("tau_s", "balanced_tau_s", "max_load_tokens", "sum_load_tokens",
                            "imbalance_tokens", "running", "pool")}
        self.sample_t: list[float] = []
        self.sample_step: list[int] = []
        self.sample_loads: list[np.ndarray] = []

    def stretch(self, st: ClusterState, c: float, n: int, t: float, step: int,
                pool_len: int, deadline_s: float | None) -> tuple[int, float]:
        """Record up to ``n`` steps from the current state; stop early after the step
        that ends at or past ``deadline_s``. Returns (steps taken, time at their end)."""
        alive = st.alive
        occ = st.occupied
        load = ((st.prompt + st.decoded) * occ).sum(axis=1)[alive].astype(np.float64)
        cnt = occ.sum(axis=1)[alive].astype(np.float64)
        a, b = st.step_a[alive], st.step_b[alive]
        j = np.arange(n, dtype=np.float64)
        loads = load[:, None] + cnt[:, None] * j[None, :]
        per = a[:, None] * loads + (c * cnt + b)[:, None]
        tau = per.max(axis=0)
        ends = t + np.cumsum(tau)
        if deadline_s is not None:
            hit = int(np.searchsorted(ends, deadline_s, side="left"))
            if hit < n:
                n = hit + 1
                tau, loads, per, ends = tau[:n], loads[:, :n], per[:, :n], ends[:n]
        mx = loads.max(axis=0)
        sm = loads.sum(axis=0)
        ch = self.chunks
        ch["tau_s"].append(tau)
        ch["balanced_tau_s"].append(per.mean(axis=0))
        ch["max_load_tokens"].append(mx)
        ch["sum_load_tokens"].append(sm)
        ch["imbalance_tokens"].append(load.shape[0] * mx - sm)
        ch["running"].append(np.full(n, cnt.sum(), dtype=np.int64))
        ch["pool"].append(np.full(n, pool_len, dtype=np.int64))
        self.sample_t.append(t)
        self.sample_step.append(step)
        self.sample_loads.append(((st.prompt + st.decoded) * occ).sum(axis=1))
        return n, float(ends[-1])

    def series(self) -> StepSeries:
        cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in self.chunks.items()}
        loads = (np.stack(self.sample_loads) if self.sample_loads
                 else np.zeros((0, 0), dtype=np.int64))
        return StepSeries(
            tau_s=cat["tau_s"], balanced_tau_s=cat["balanced_tau_s"],
            max_load_tokens=cat["max_load_tokens"], sum_load_tokens=cat["sum_load_tokens"],
            imbalance_tokens=cat["imbalance_tokens"], running=cat["running"].astype(np.int64),
            pool=cat["pool"].astype(np.int64), sample_t_s=np.asarray(self.sample_t),
            sample_step=np.asarray(self.sample_step, dtype=np.int64), sample_loads=loads)


def simulate(trace: Trace, config: SimConfig, policy_options: dict[str, Any] | None = None,
             *, predictor: TerminationPredictor | None = None,
             progress: bool = False) -> SimResult:
    """Run ``trace`` through the PD model under ``config``; deterministic for a seed.

    ``policy_options`` are extra :class:`PolicyConfig` fields (e.g. ``r_max``);
    ``predictor`` overrides ``config.predictor`` (an instance, e.g. warm-started).

    Raises:
        ValueError: a bad policy option (named), an unknown predictor, or a prompt that
            can never fit the KV limit.
    """
    wall0 = time.perf_counter()
    n = len(trace)
    g = config.replicas
    prompt = trace.input_tokens
    output = trace.output_tokens
    kv = config.kv_limit_tokens
    if kv is not None and n and int(prompt.max()) > kv:
        bad = int(np.argmax(prompt > kv))
        raise ValueError(f"kv_limit_tokens: request {bad} has a {int(prompt[bad])}-token "
                         f"prompt, more than the limit {kv}")
    opts = dict(policy_options or {})
    opts.setdefault("horizon", config.horizon)
    pcfg = parse_policy_config(opts, policy=config.policy)
    pred = predictor if predictor is not None else build_predictor(config)
    policy = make_policy(pcfg, PolicyContext(rng=np.random.default_rng(config.seed),
                                             predictor=pred, clock=lambda: 0.0))
    detail = config.policy == "brh"
    oracle = detail and pred is not None and pred.name == "oracle"

    st = ClusterState(g, config.slots, kv, config.step_a_s_per_token, config.step_b_s)
    c = config.step_c_s_per_request
    arrival = trace.arrival_s if not config.saturated else np.zeros(n)
    prefix = _prefix_hashes(trace)
    hids = trace.hash_ids
    prompt_l = prompt.tolist()
    output_l = output.tolist()

    def make(i: int, enq_s: float, step: int) -> PoolRequest:
        return PoolRequest(f"r{i}", prompt_l[i], enq_s, step, float(arrival[i]),
                           None if prefix[i] < 0 else prefix[i],
                           None if hids is None else hids[i])

    pool_cap = config.pool_capacity
    pool = PromptPool(pool_cap)
    feeder: PrefillFeeder | BacklogFeeder
    if config.saturated:
        feeder = BacklogFeeder(n, make)
    else:
        feeder = PrefillFeeder(arrival, prompt, config.prefill_instances, config.prefill_p0_s,
                               config.prefill_p1_s_per_token, make)

    admit_step = np.full(n, -1, dtype=np.int64)
    replica = np.full(n, -1, dtype=np.int64)
    enqueue_s = np.full(n, np.nan)
    tick_ns: list[int] = []
    steps = _Steps()
    t, k = 0.0, 0
    steady_steps: int | None = None
    changed = True
    finished_total = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=config.label, unit="req", mininterval=0.5)

    while True:
        if feeder.deliver(t, k, pool):
            changed = True
        while changed and len(pool) and int(st.free_slots().sum()) > 0:
            changed = False
            snap = st.snapshot(detail=detail, oracle=oracle)
            t0 = time.perf_counter_ns()
            res = policy.schedule(snap, pool, t, k)
            tick_ns.append(time.perf_counter_ns() - t0)
            if not res.assignments:
                break
            for a, req in zip(res.assignments, pool.remove_many(res.assignments),
                              strict=True):
                i = int(a.request_id[1:])
                st.admit(a, req, output_tokens=output_l[i])
                admit_step[i] = k
                replica[i] = a.replica
                enqueue_s[i] = req.enqueued_s
            if feeder.on_room(t, k, pool):
                changed = True
        changed = False
        if steady_steps is None and config.saturated and not len(pool) and feeder.exhausted:
            steady_steps = k
        occ = st.occupied
        if not occ.any():
            if feeder.exhausted and not len(pool):
                break
            nxt = feeder.next_event_s()
            if nxt is None:
                raise ValueError("simulation stalled: the pool holds requests that no "
                                 "replica can take (check kv_limit_tokens and slots)")
            t = max(t, nxt)
            continue
        rem = int(np.where(occ, st.target - st.decoded, _NEVER).min())
        todo = min(rem, config.max_stretch_steps)
        deadline = None
        if int(st.free_slots().sum()) > 0:
            deadline = feeder.next_event_s()
        took, t = steps.stretch(st, c, todo, t, k, len(pool), deadline)
        st.advance(took)
        k += took
        if took < rem:
            continue
        done = st.finished_by_target()
        if done:
            changed = True
            rows = [int(r[1:]) for r in done]
            for rid in done:
                st.finish(rid)
            finished_total += len(rows)
            if bar is not None:
                bar.update(len(rows))
            if pred is not None:
                idx = np.asarray(rows, dtype=np.int64)
                pred.observe(FinishedRequests(
                    prompt_tokens=prompt[idx], output_tokens=output[idx],
                    prefix_hash=np.asarray([prefix[i] for i in rows], dtype=np.int64),
                    finish_s=np.full(len(rows), t),
                    hash_ids=None if hids is None else tuple(hids[i] for i in rows)))
    if bar is not None:
        bar.close()
    series = steps.series()
    return SimResult(
        config=config, policy_options=opts, predictor_name=None if pred is None else pred.name,
        source=trace.source, arrival_s=np.asarray(arrival, dtype=np.float64),
        output_tokens=np.asarray(output), admit_step=admit_step, replica=replica,
        enqueue_s=enqueue_s, steps=series, tick_ns=np.asarray(tick_ns, dtype=np.int64),
        steady_steps=steady_steps, wall_s=time.perf_counter() - wall0)
