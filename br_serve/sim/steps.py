"""Per-step columns of a simulated run, accumulated one vectorised stretch at a time
(moved out of :mod:`br_serve.sim.engine`, unchanged)."""

from __future__ import annotations

import numpy as np

from br_serve.core.calibration import StepCalibrator
from br_serve.core.state import ClusterState
from br_serve.sim.perturb import StepPerturbation
from br_serve.sim.result import StepSeries


class Steps:
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
