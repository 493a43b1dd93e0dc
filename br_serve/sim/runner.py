"""Run many (spec, replay) simulations in parallel processes, deterministically.

Each task is one :func:`br_serve.sim.simulate` call on one replay under one
:class:`RunSpec`, optionally time-scaled; its summary depends only on the task, so the
results are the same for any ``jobs`` (wall-clock fields excepted: see
:data:`WALL_CLOCK_KEYS`). Workers are forked from a fork server (never from the
caller's process, which may run threads); they receive the replays, specs and
warm-start history once (pool initializer), then only task indices.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from br_serve.sim.config import SimConfig, parse_sim_config
from br_serve.sim.engine import simulate
from br_serve.sim.predict import build_predictor, warm_start_from
from br_serve.sim.replays import Replay
from br_serve.sim.stationary import Stationary, stationary_summary
from br_serve.traces import Trace

#: Summary fields measured on the wall clock (the policy's tick latency, the run's own
#: duration): they differ between two runs of the same task and are left out of any
#: determinism comparison.
WALL_CLOCK_KEYS = frozenset({"wall_s", "steps_per_s", "tick_p50_us", "tick_p99_us"})


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One contender of an ensemble: a simulator configuration (policy, its options,
    predictor, cluster); ``label`` names it in tables and pairings (default:
    ``config.label``, e.g. ``brh+oracle``). Two specs may share a policy and differ in
    options, each with its own label (e.g. ``br0`` with ageing off as ``br0-noage``)."""

    config: SimConfig
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.config.label


@dataclass(frozen=True, slots=True)
class Task:
    """Simulate replay ``replay`` under spec ``spec``, arrivals divided by
    ``rate_scale`` (2.0 = twice the request rate)."""

    spec: int
    replay: int
    rate_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class _Job:
    specs: tuple[RunSpec, ...]
    replays: tuple[Replay, ...]
    stationary: Stationary | None
    warm_start: Trace | None


_WORKER_JOB: _Job | None = None


def _init_worker(job: _Job) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job


def _run_in_worker(task: Task) -> dict[str, Any]:
    assert _WORKER_JOB is not None
    return run_task(_WORKER_JOB, task)


def replay_config(spec: RunSpec, replay: Replay, stationary: Stationary | None) -> SimConfig:
    """The configuration replay ``replay`` of ``spec`` is simulated with."""
    cfg = parse_sim_config(spec.config, seed=replay.seed)
    return stationary.sim_config(cfg) if stationary is not None else cfg


def run_task(job: _Job, task: Task) -> dict[str, Any]:
    """One simulation; its summary row (with ``label``, ``replay`` and ``rate_scale``)."""
    spec, rep = job.specs[task.spec], job.replays[task.replay]
    cfg = replay_config(spec, rep, job.stationary)
    trace = rep.trace if task.rate_scale == 1.0 else rep.trace.scaled(1.0 / task.rate_scale)
    pred = build_predictor(cfg)
    if pred is not None and job.warm_start is not None:
        warm_start_from(pred, job.warm_start)
    res = simulate(trace, cfg, predictor=pred)
    row = (stationary_summary(res, job.stationary) if job.stationary is not None
           else res.summary())
    first, _ = res.request_times()
    # per request, for the pairing against the baseline's replay (removed from the row
    # there): TTFT in seconds, NaN where it never got a first token
    row["_ttft_s"] = (first - res.arrival_s).tolist()
    row.update(label=spec.name, replay=rep.index, replay_start=rep.start,
               replay_mode=rep.mode, rate_scale=task.rate_scale,
               offered_req_s=_rate(trace))
    return row


def _rate(trace: Trace) -> float | None:
    return (len(trace) - 1) / trace.duration_s if trace.duration_s > 0 else None


def default_jobs() -> int:
    return os.cpu_count() or 1


class Runner:
    """Runs :class:`Task` s over fixed specs and replays with ``jobs`` processes.

    ``jobs = 1`` runs in this process (no worker processes). Use as a context manager so the worker
    pool is shut down; :meth:`run` may be called many times (the capacity search does).
    """

    def __init__(self, specs: Sequence[RunSpec], replays: Sequence[Replay], *,
                 stationary: Stationary | None = None, warm_start: Trace | None = None,
                 jobs: int | None = None) -> None:
        jobs = default_jobs() if jobs is None else jobs
        if jobs < 1:
            raise ValueError(f"jobs: must be >= 1 (got {jobs})")
        if not specs:
            raise ValueError("policies: no runs to simulate")
        names = [s.name for s in specs]
        keys = [(s.name, s.config.replicas, s.config.slots) for s in specs]
        if len(set(keys)) != len(keys):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"policies: label(s) {dup} appear twice for one cluster; "
                             f"give each spec a distinct label")
        if stationary is not None:
            for s in specs:
                for r in replays:
                    stationary.check(len(r.trace), s.config)
        self.job = _Job(tuple(specs), tuple(replays), stationary, warm_start)
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def run(self, tasks: Sequence[Task],
            progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
        """Summaries of ``tasks``, in the order given."""
        n = len(tasks)
        if self.jobs == 1 or n <= 1:
            out = []
            for i, t in enumerate(tasks):
                out.append(run_task(self.job, t))
                if progress is not None:
                    progress(i + 1, n)
            return out
        if self._pool is None:
            # Workers come from a fork server, not from this process: a caller may run
            # threads (Ray, a web server, torch's pools), and a child forked while one
            # of them holds a lock can hang for good. The server is a fresh process
            # that imports the simulator once; its forks are cheap. The job (specs,
            # replays) is pickled to each worker once.
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["br_serve.sim.runner"])
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx,
                                             initializer=_init_worker, initargs=(self.job,))
        futures = [self._pool.submit(_run_in_worker, t) for t in tasks]
        results: list[dict[str, Any]] = []
        for i, f in enumerate(futures):
            results.append(f.result())
            if progress is not None:
                progress(i + 1, n)
        return results
