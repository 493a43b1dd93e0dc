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
from collections.abc import Sequence

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
from br_serve.core.ahead import engine_free, engine_slots_only, queue_room
from br_serve.core.calibration import StepCalibrator, with_coefficients
from br_serve.core.predictor import reads_true_remaining
from br_serve.core.state import ClusterState
from br_serve.sim.config import SimConfig
from br_serve.sim.dyntralb import DyntraLBEngine
from br_serve.sim.feed import BacklogFeeder, PrefillFeeder
from br_serve.sim.perturb import StepPerturbation
from br_serve.sim.predict import build_predictor, prefix_hashes
from br_serve.sim.result import SimResult
from br_serve.sim.steps import Steps
from br_serve.traces import Trace

_NEVER = np.iinfo(np.int64).max


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

    st = ClusterState(g, config.rank_capacity, kv, config.step_model())
    dl = _dyntralb(config)
    finish_step = np.full(n, -1, dtype=np.int64) if dl is not None else None
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
    steps = Steps(StepPerturbation(g, config.sim.step_drift, config.sim.step_noise_cv,
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
    ahead = config.sim.dispatch_ahead > 0

    def _bind(placed: Sequence[Assignment]) -> None:
        """Move ``placed`` from the pool onto their replicas."""
        for a, req in zip(placed, pool.remove_many(placed), strict=True):
            i = int(a.request_id[1:])
            st.admit(a, req, output_tokens=output_l[i])
            if dl is None:
                admit_step[i] = k + lag.add(a)
            else:  # its first token comes when its rank's engine first runs it
                dl.bind(a.request_id, a.replica, a.prompt_tokens)
            replica[i] = a.replica
            enqueue_s[i] = req.enqueued_s

    # one request per tick as the live scheduler sees them, or all due at once
    per_delivery = 1 if config.sim.tick_per_delivery else None
    while True:
        if feeder.deliver(t, k, pool, per_delivery):
            changed = True
        if retick is not None and t >= retick:
            changed, retick = True, None
        cnt = st.running_requests()
        while changed and len(pool) and fast.free(cnt) > 0:
            changed = False
            chosen: list[Assignment] = []
            retick = None  # a hold's hint from any of this tick's policy calls
            # the graph's dispatch ahead: as its scheduler's tick, free engine slots
            # first, then queue places for the backlog only (br_serve.core.ahead)
            for phase in ("engine", "queue") if ahead else ("all",):
                if not len(pool):
                    break
                if dl is not None:  # the ranks' queues: the policy tells them apart
                    snap = st.snapshot(detail=detail, oracle=oracle,
                                       queued=dl.waiting_mask(st), engine_slots=config.slots)
                else:
                    snap = (st.snapshot(detail=True, oracle=oracle) if detail
                            else fast.snapshot(st.load_tokens(), cnt))
                limit = None
                if phase == "engine":
                    if not engine_free(snap).any():
                        continue
                    snap = engine_slots_only(snap)
                elif phase == "queue":
                    limit = queue_room(snap, len(pool))
                    if limit <= 0:
                        break
                if calib is not None:
                    snap = with_coefficients(snap, calib.coefficients())
                t0 = time.perf_counter_ns()
                res = policy.schedule(snap, pool, t, k)
                tick_ns.append(time.perf_counter_ns() - t0)
                pred_failed += not res.predictor_ok
                if res.retick_s is not None and res.retick_s > t:
                    retick = res.retick_s
                placed = res.assignments if limit is None else res.assignments[:limit]
                _bind(placed)
                chosen += placed
            if not chosen:
                break
            cnt = st.running_requests()
            if feeder.on_room(t, k, pool, per_delivery):
                changed = True
        if per_delivery and feeder.waiting(t, pool):
            changed = True  # the next delivery of this boundary gets its own tick
            continue
        changed = False
        if steady_steps is None and config.sim.saturated and not len(pool) and feeder.exhausted:
            steady_steps = k
        occ = st.occupied
        if not cnt.any():
            if dl is not None:
                dl.end_step(st, idle=True)
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
        active = None
        if dl is not None:  # DyntraLB decides which bound requests decode, step by step
            active = dl.begin_step(st)
            step_load = ((st.prompt + st.decoded) * active).sum(axis=1)
            step_cnt = active.sum(axis=1)
            todo = 1
        deadline = _earliest(feeder.next_event_s(), retick) if fast.free(cnt) > 0 else None
        took, t = steps.stretch(st, step_load, step_cnt, todo, t, k, len(pool),
                                deadline)
        st.advance(took, where=active)
        lag.stepped(st)
        k += took
        done = st.finished_by_target() if took >= rem else []
        if dl is not None:
            assert active is not None and finish_step is not None
            _first_tokens(st, active, admit_step, k - 1)
            for rid in done:
                finish_step[int(rid[1:])] = k - 1
                dl.finish(rid, st.where(rid)[0])
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
        if dl is not None:
            dl.end_step(st, idle=False)
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
        enqueue_order=enqueue_order, prompt_tokens=np.asarray(prompt),
        finish_step=finish_step, engine_stats=None if dl is None else dl.stats())


def _dyntralb(config: SimConfig) -> DyntraLBEngine | None:
    d = config.dyntralb
    if config.sim.dispatch_ahead:  # a FIFO queue per rank: DyntraLB's lists, no plans
        return DyntraLBEngine(config.replicas, config.slots, 1e18, d.block_tokens,
                              "dynamic", d.start_step, 1 << 40, d.dynamic_max_steps)
    if d.bubble_threshold_blocks is None:
        return None
    return DyntraLBEngine(config.replicas, config.slots,
                          d.bubble_threshold_blocks, d.block_tokens, d.mode,
                          d.start_step, d.long_request_blocks, d.dynamic_max_steps)


def _first_tokens(st: ClusterState, active: np.ndarray, first_step: np.ndarray,
                  step: int) -> None:
    """Record ``step`` as the first decode step of requests that just produced their
    first token."""
    gi, si = np.nonzero(active & (st.decoded == 1))
    for g, s in zip(gi.tolist(), si.tolist(), strict=True):
        first_step[int(str(st.ids[g][s])[1:])] = step
