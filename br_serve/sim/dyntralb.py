"""DyntraLB as an engine-side option of the simulated decode ranks (docs/simulator.md).

With ``dyntralb_bubble_threshold_blocks`` set, each rank holds up to ``slots`` running
requests plus ``dyntralb_waiting_per_rank`` bound but waiting ones (the router's policy
sees ``slots + waiting`` per rank: a vLLM engine queues what its router sends beyond its
batch). Which bound requests decode each step is the engine's choice:

- without a plan (DyntraLB inactive, or the first active step), vLLM's own scheduler:
  running requests keep running and waiting ones are admitted in order while the batch
  has room;
- with a plan (computed after the previous step by :func:`br_serve.core.dyntralb.plan`
  from every rank's running and waiting block counts), the rank pauses and admits what
  its plan says and, frozen, admits nothing else.

A paused request keeps its KV and its rank; it does not decode that step, so the step
carries neither its tokens nor its load, and its TPOT grows by the step it sat out.
Nothing is dropped, duplicated or moved to another rank.

Activation, per vllm-ascend (``patch_dyntra_lb_core.py``): plans are made only from the
``dyntralb_start_step``-th step of a busy period on (the step counter restarts when the
cluster runs empty); ``static`` mode plans on every such step; ``dynamic`` mode (the
real default) only after a request of more than ``dyntralb_long_request_blocks`` blocks
was bound, until ``dyntralb_dynamic_max_steps`` active steps pass without another.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from br_serve.core.dyntralb import RankPlan, plan
from br_serve.core.state import ClusterState


class DyntraLBEngine:
    """Per-rank running / waiting lists and the pending plan (one per simulation)."""

    def __init__(self, g: int, max_running: int, threshold: float, block_tokens: int,
                 mode: str, start_step: int, long_request_blocks: int,
                 dynamic_max_steps: int) -> None:
        self.max_running = max_running
        self.threshold = threshold
        self.block_tokens = block_tokens
        self.mode = mode
        self.start_step = start_step
        self.long_blocks = long_request_blocks
        self.dynamic_max = dynamic_max_steps
        self.running: list[list[str]] = [[] for _ in range(g)]
        self.waiting: list[list[str]] = [[] for _ in range(g)]
        self.pending: list[RankPlan] | None = None
        self.busy_steps = 0          # the engine's step_counter, reset when idle
        self.dynamic_on = False
        self.dynamic_idle = 0
        self.long_bound = False      # a long request was bound since the last check
        #: counters for the run's summary
        self.planned_steps = 0
        self.paused_request_steps = 0
        self.decoding_request_steps = 0

    def bind(self, rid: str, rank: int, prompt_tokens: int) -> None:
        """A request the router bound to ``rank`` joins its waiting list."""
        self.waiting[rank].append(rid)
        if -(-prompt_tokens // self.block_tokens) > self.long_blocks:
            self.long_bound = True

    def waiting_mask(self, st: ClusterState) -> np.ndarray:
        """The ``(G, B)`` mask of the bound requests waiting (not decoding)."""
        mask = np.zeros(st.occupied.shape, dtype=bool)
        for wait in self.waiting:
            for rid in wait:
                mask[st.where(rid)] = True
        return mask

    def finish(self, rid: str, rank: int) -> None:
        self.running[rank].remove(rid)

    def begin_step(self, st: ClusterState) -> np.ndarray:
        """Apply the pending plan (or vLLM's own admission) and return the ``(G, B)``
        mask of the slots that decode in this step."""
        plans = self.pending
        self.pending = None
        for g in range(len(self.running)):
            run, wait = self.running[g], self.waiting[g]
            if plans is not None:
                p = plans[g]
                for rid in p.pause:
                    if rid in run:
                        run.remove(rid)
                        wait.insert(0, rid)  # paused requests go back to the front
                for rid in p.admit:
                    if rid in wait and len(run) < self.max_running:
                        wait.remove(rid)
                        run.append(rid)
                continue  # under a plan a rank admits what it says and nothing else
            while wait and len(run) < self.max_running:
                run.append(wait.pop(0))
        mask = np.zeros(st.occupied.shape, dtype=bool)
        n_run = 0
        for g in range(len(self.running)):
            for rid in self.running[g]:
                mask[st.where(rid)] = True
            n_run += len(self.running[g])
        n_wait = sum(len(w) for w in self.waiting)
        self.paused_request_steps += n_wait
        self.decoding_request_steps += n_run
        return mask

    def end_step(self, st: ClusterState, idle: bool) -> None:
        """After a step: count it and, when DyntraLB is active, plan the next one."""
        if idle:
            self.busy_steps = 0
            self.dynamic_on = False
            return
        active = self._active()
        self.busy_steps += 1
        if not active:
            return
        bt = self.block_tokens
        blk = (st.prompt + st.decoded + bt - 1) // bt
        where = st.where

        def rows(ids: list[str]) -> list[tuple[Hashable, int]]:
            return [(r, int(blk[where(r)])) for r in ids]

        ranks = [(rows(run), rows(wait))
                 for run, wait in zip(self.running, self.waiting, strict=True)]
        self.pending = plan(ranks, self.threshold, self.max_running)
        self.planned_steps += 1

    def _active(self) -> bool:
        """vllm-ascend's ``run_balance_load`` gate for the plan made after this step."""
        fresh_long, self.long_bound = self.long_bound, False
        if self.mode == "dynamic":
            if not self.dynamic_on:
                if not fresh_long:
                    return False
                self.dynamic_on, self.dynamic_idle = True, 0
                fresh_long = True
            in_window = self.busy_steps >= self.start_step
            if in_window:
                self.dynamic_idle = 0 if fresh_long else self.dynamic_idle + 1
                if self.dynamic_idle >= self.dynamic_max:
                    self.dynamic_on = False
            return in_window
        return self.busy_steps >= self.start_step

    def stats(self) -> dict[str, float | int]:
        total = self.paused_request_steps + self.decoding_request_steps
        return {"dyntralb_planned_steps": self.planned_steps,
                "dyntralb_waiting_share": (self.paused_request_steps / total
                                           if total else 0.0)}
