"""The discrete-event decode simulator (docs/simulator.md).

Time advances by decode steps. Between two *events* (a request finishes; a prefill
lands in the pool while a slot is free) nothing a policy could see changes except that
every running request grows by one token per step, so the loop jumps over such a
stretch in one vectorised go: loads are ``L_g(k+j) = L_g(k) + N_g j`` and the step
times, maxima and imbalances of the whole stretch are computed with numpy.

Conventions (see docs/simulator.md):
- A request with output ``o`` runs ``o`` decode steps after admission and produces one
  token at the end of each; its load during its ``j``-th step is ``s + j`` (j from 0).
- The policy ticks at a step boundary when the pool is non-empty, a slot is free and
  something changed since its last tick (a finish, a delivery into the pool), or the
  time its last tick asked to be ticked again (``TickResult.retick_s``: a policy that
  holds a request for a bounded time) has come; a stretch of steps stops at that time
  as at a delivery. A tick that assigns nothing waits for the next of these.
- The policy context gets a frozen clock, so BR-H's predictor timeout never fires and
  results do not depend on machine load; the tick's wall time is measured separately.
"""

from __future__ import annotations

import time

import numpy as np

from br_serve.core import (
    Assignment,
    ClusterSnapshot,
    FinishedRequests,
    PolicyContext,
    PoolRequest,
    PromptPool,
    RunningRequests,
    TerminationPredictor,
    policy_class,
)
from br_serve.core.calibration import StepCalibrator, with_coefficients
from br_serve.core.predictor import reads_true_remaining
from br_serve.core.state import ClusterState
from br_serve.sim.config import SimConfig
from br_serve.sim.feed import BacklogFeeder, PrefillFeeder
from br_serve.sim.perturb import StepPerturbation
from br_serve.sim.predict import build_predictor, prefix_hashes
from br_serve.sim.result import SimResult, StepSeries
from br_serve.traces import Trace

_NEVER = np.iinfo(np.int64).max


class _Steps:
    """Accumulates per-step columns, one numpy chunk per stretch.

    ``perturb`` multiplies each replica's modelled step time by its drift and noise
    factors (:mod:`br_serve.sim.perturb`)."""

    def __init__(self, perturb: StepPerturbation | None = None,
                 calibrator: StepCalibrator | None = None) -> None:
        self.perturb = perturb if perturb is not None and perturb.active else None
        #: fed every step's per-replica (load, running, compute time), as the live
        #: scheduler is fed by the replicas' reports
        self.calibrator = calibrator
        self.chunks: dict[str, list[np.ndarray]] = {
            k: [] for k in ("tau_s", "balanced_tau_s", "max_load_tokens", "sum_load_tokens",
                            "imbalance_tokens", "running", "pool")}
        self.sample_t: list[float] = []
        self.sample_step: list[int] = []
        self.sample_loads: list[np.ndarray] = []

    def stretch(self, st: ClusterState, load_i: np.ndarray, cnt_i: np.ndarray,
                n: int, t: float, step: int, pool_len: int,
                deadline_s: float | None) -> tuple[int, float]:
        """Record up to ``n`` steps from loads ``load_i`` / counts ``cnt_i``; stop early
        after the step that ends at or past ``deadline_s``. Returns (steps, end time)."""
        alive = st.alive
        all_alive = bool(alive.all())
        load = (load_i if all_alive else load_i[alive]).astype(np.float64)
        cnt = (cnt_i if all_alive else cnt_i[alive]).astype(np.float64)
        a = st.step_a if all_alive else st.step_a[alive]
        b = st.step_b if all_alive else st.step_b[alive]
        c = st.step_c if all_alive else st.step_c[alive]
        base = a * load + (c * cnt + b)
        pf = None
        if self.perturb is not None:
            pf = self.perturb.factors(step, n)
            pf = pf if all_alive else pf[alive]
        ch = self.chunks
        if n == 1:  # the common case between close events: no 2-D work
            if pf is not None:
                base = base * pf[:, 0]
            tau1 = float(base.max())
            mx = float(load.max())
            sm = float(load.sum())
            ch["tau_s"].append(np.array([tau1]))
            ch["balanced_tau_s"].append(np.array([float(base.mean())]))
            ch["max_load_tokens"].append(np.array([mx]))
            ch["sum_load_tokens"].append(np.array([sm]))
            ch["imbalance_tokens"].append(np.array([load.shape[0] * mx - sm]))
            ends_last = t + tau1
            if self.calibrator is not None:
                self._observe(alive, load[:, None], cnt, base[:, None])
        else:
            j = np.arange(n, dtype=np.float64)
            loads = load[:, None] + cnt[:, None] * j[None, :]
            per = base[:, None] + (a * cnt)[:, None] * j[None, :]
            if pf is not None:
                per = per * pf
            tau = per.max(axis=0)
            ends = t + np.cumsum(tau)
            if deadline_s is not None:
                hit = int(np.searchsorted(ends, deadline_s, side="left"))
                if hit < n:
                    n = hit + 1
                    tau, loads, per, ends = tau[:n], loads[:, :n], per[:, :n], ends[:n]
            mx_a = loads.max(axis=0)
            sm_a = loads.sum(axis=0)
            ch["tau_s"].append(tau)
            ch["balanced_tau_s"].append(per.mean(axis=0))
            ch["max_load_tokens"].append(mx_a)
            ch["sum_load_tokens"].append(sm_a)
            ch["imbalance_tokens"].append(load.shape[0] * mx_a - sm_a)
            ends_last = float(ends[-1])
            if self.calibrator is not None:
                self._observe(alive, loads, cnt, per)
        ch["running"].append(np.full(n, int(cnt.sum()), dtype=np.int64))
        ch["pool"].append(np.full(n, pool_len, dtype=np.int64))
        self.sample_t.append(t)
        self.sample_step.append(step)
        self.sample_loads.append(load_i)
        return n, ends_last

    def _observe(self, alive: np.ndarray, loads: np.ndarray, cnt: np.ndarray,
                 per: np.ndarray) -> None:
        """Feed the calibrator step by step (rows: alive replicas; columns: steps)."""
        assert self.calibrator is not None
        g = alive.shape[0]
        full_l, full_t = np.zeros(g), np.zeros(g)
        full_n = np.zeros(g)
        full_n[alive] = cnt
        for j in range(per.shape[1]):
            full_l[alive] = loads[:, j]
            full_t[alive] = per[:, j]
            self.calibrator.update(full_l, full_n, full_t, mask=alive)

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


def _ro(a: np.ndarray) -> np.ndarray:
    out = np.array(a, copy=True)
    out.flags.writeable = False
    return out


class _SnapshotMaker:
    """Cheap snapshots for policies that need replica totals only.

    ``ClusterState`` already guarantees the invariants ``ClusterSnapshot.build`` checks,
    and slots / limits / coefficients never change during a run (no failures are
    simulated), so the constant arrays are frozen once and only loads and counts are
    copied per tick.
    """

    def __init__(self, st: ClusterState) -> None:
        self.slots = _ro(st.slots)
        self.kv = _ro(st.kv_limit)
        self.alive = _ro(st.alive)
        self.a = _ro(st.step_a)
        self.b = _ro(st.step_b)
        self.c = _ro(st.step_c)
        self.free_cap = np.where(st.alive, st.slots, 0)
        self.empty = RunningRequests.empty()

    def free(self, cnt: np.ndarray) -> int:
        return int((self.free_cap - np.where(self.alive, cnt, 0)).sum())

    def snapshot(self, load: np.ndarray, cnt: np.ndarray) -> ClusterSnapshot:
        return ClusterSnapshot(_ro(load), _ro(cnt), self.slots, self.kv, self.alive,
                               self.a, self.b, self.c, self.empty)


class _Lag:
    """Requests assigned but not yet decoding (``admit_delay_steps``): they hold a slot
    and count in the policy's view, but are left out of the step's load and tokens."""

    def __init__(self, g: int, delay: int) -> None:
        self.delay = delay
        self.pending: dict[str, tuple[int, int, int]] = {}  # id -> (replica, prompt, left)
        self.load = np.zeros(g, dtype=np.int64)
        self.cnt = np.zeros(g, dtype=np.int64)

    def add(self, a: Assignment) -> int:
        """Hold ``a`` for the delay; returns the steps until its first decode step."""
        if self.delay:
            self.pending[a.request_id] = (a.replica, a.prompt_tokens, self.delay)
            self.load[a.replica] += a.prompt_tokens
            self.cnt[a.replica] += 1
        return self.delay

    def _drop(self, rid: str) -> None:
        g, p, _ = self.pending.pop(rid)
        self.load[g] -= p
        self.cnt[g] -= 1

    def release_all(self) -> list[str]:
        ids = list(self.pending)
        for rid in ids:
            self._drop(rid)
        return ids

    def stepped(self, st: ClusterState) -> None:
        """One step ran without them: undo its decode for them, count down."""
        for rid, (g, p, left) in list(self.pending.items()):
            st.set_decoded(rid, 0)
            if left <= 1:
                self._drop(rid)
            else:
                self.pending[rid] = (g, p, left - 1)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def simulate(trace: Trace, config: SimConfig, *,
             predictor: TerminationPredictor | None = None,
             progress: bool = False) -> SimResult:
    """Run ``trace`` through the PD model under ``config``; deterministic for a seed.

    The policy is ``config.policy`` (name and options); ``predictor`` overrides the one
    ``config.predictor`` describes (an instance, e.g. warm-started).

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
    cls = policy_class(config.policy.name)
    pred = predictor if predictor is not None else build_predictor(config)
    policy = cls(config.policy.parsed(),
                 PolicyContext(rng=np.random.default_rng(config.seed), predictor=pred,
                               clock=lambda: 0.0))
    needs = cls.needs_for(policy.options)
    detail = needs.running_detail
    oracle = detail and pred is not None and reads_true_remaining(pred)

    st = ClusterState(g, config.slots, kv, config.step_model())
    calib = StepCalibrator(g, st.step) if needs.calibrated_step_costs else None
    arrival = trace.arrival_s if not config.sim.saturated else np.zeros(n)
    prefix = prefix_hashes(trace.hash_ids, n)
    hids = trace.hash_ids
    prompt_l = prompt.tolist()
    output_l = output.tolist()

    # pool-entry order and step of every request (FCFS order, pool ages); feeders call
    # make() exactly when they add the request to the pool
    enqueue_step = np.full(n, -1, dtype=np.int64)
    enqueue_order = np.full(n, -1, dtype=np.int64)
    enqueue_s = np.full(n, np.nan)
    entered = [0]

    def make(i: int, enq_s: float, step: int) -> PoolRequest:
        enqueue_step[i] = step
        enqueue_s[i] = enq_s
        enqueue_order[i] = entered[0]
        entered[0] += 1
        return PoolRequest(f"r{i}", prompt_l[i], enq_s, step, float(arrival[i]),
                           None if prefix[i] < 0 else prefix[i],
                           None if hids is None else hids[i])

    pool_cap = config.pool.capacity
    pool = PromptPool(pool_cap)
    feeder: PrefillFeeder | BacklogFeeder
    if config.sim.saturated:
        feeder = BacklogFeeder(n, make)
    else:
        feeder = PrefillFeeder(arrival, prompt, config.prefill.replicas, config.prefill.p0_s,
                               config.prefill.p1_s_per_token, make)

    admit_step = np.full(n, -1, dtype=np.int64)
    replica = np.full(n, -1, dtype=np.int64)
    tick_ns: list[int] = []
    pred_failed = 0
    steps = _Steps(StepPerturbation(g, config.sim.step_drift, config.sim.step_noise_cv,
                                    config.seed), calib)
    t, k = 0.0, 0
    steady_steps: int | None = None
    changed = True
    finished_total = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=config.label, unit="req", mininterval=0.5)

    fast = _SnapshotMaker(st)
    lag = _Lag(g, config.sim.admit_delay_steps)
    retick: float | None = None  # the policy's latest "tick me again at" hint
    while True:
        if feeder.deliver(t, k, pool):
            changed = True
        if retick is not None and t >= retick:
            changed, retick = True, None
        cnt = st.running_requests()
        while changed and len(pool) and fast.free(cnt) > 0:
            changed = False
            snap = (st.snapshot(detail=True, oracle=oracle) if detail
                    else fast.snapshot(st.load_tokens(), cnt))
            if calib is not None:
                snap = with_coefficients(snap, calib.coefficients())
            t0 = time.perf_counter_ns()
            res = policy.schedule(snap, pool, t, k)
            tick_ns.append(time.perf_counter_ns() - t0)
            pred_failed += not res.predictor_ok
            retick = res.retick_s if res.retick_s is not None and res.retick_s > t else None
            if not res.assignments:
                break
            for a, req in zip(res.assignments, pool.remove_many(res.assignments),
                              strict=True):
                i = int(a.request_id[1:])
                st.admit(a, req, output_tokens=output_l[i])
                admit_step[i] = k + lag.add(a)
                replica[i] = a.replica
                enqueue_s[i] = req.enqueued_s
            cnt = st.running_requests()
            if feeder.on_room(t, k, pool):
                changed = True
        changed = False
        if steady_steps is None and config.sim.saturated and not len(pool) and feeder.exhausted:
            steady_steps = k
        occ = st.occupied
        if not cnt.any():
            if feeder.exhausted and not len(pool):
                break
            nxt = _earliest(feeder.next_event_s(), retick)
            if nxt is None:
                raise ValueError("simulation stalled: the pool holds requests that no "
                                 "replica can take (check kv_limit_tokens and slots)")
            t = max(t, nxt)
            continue
        # what the next steps compute with: requests still waiting out the admission
        # delay hold their slots (cnt) but neither load nor decode
        step_load, step_cnt = st.load_tokens(), cnt
        if lag.pending:
            if int(cnt.sum()) == len(lag.pending):
                # only waiting requests: the replicas idle through the delay (an idle
                # step is not a busy step); they start with the next recorded step
                t += float(st.step_b[st.alive].max())
                for rid in lag.release_all():
                    admit_step[int(rid[1:])] = k
                continue
            step_load, step_cnt = step_load - lag.load, cnt - lag.cnt
        rem = int(np.where(occ, st.target - st.decoded, _NEVER).min())
        # one step at a time while any request waits: its delay ends at the next one
        todo = 1 if lag.pending else min(rem, config.sim.max_stretch_steps)
        deadline = _earliest(feeder.next_event_s(), retick) if fast.free(cnt) > 0 else None
        took, t = steps.stretch(st, step_load, step_cnt, todo, t, k, len(pool),
                                deadline)
        st.advance(took)
        lag.stepped(st)
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
        config=config, predictor_name=None if pred is None else pred.name,
        source=trace.source, arrival_s=np.asarray(arrival, dtype=np.float64),
        output_tokens=np.asarray(output), admit_step=admit_step, replica=replica,
        enqueue_s=enqueue_s, steps=series, tick_ns=np.asarray(tick_ns, dtype=np.int64),
        steady_steps=steady_steps, wall_s=time.perf_counter() - wall0,
        predictor_failed_ticks=pred_failed, enqueue_step=enqueue_step,
        enqueue_order=enqueue_order, prompt_tokens=np.asarray(prompt))
