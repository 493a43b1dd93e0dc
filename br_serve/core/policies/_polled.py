"""What a router that polls its engines knows between two polls (shared by the field's
rules in :mod:`br_serve.core.policies.smg`).

Real routers do not read the engines' state at every decision: a monitor task fetches
each worker's load every ``load_refresh_s`` seconds and the policies read that cached
copy, adding their own bookkeeping between polls. :class:`LoadPoll` models that clock:
polls fall on the grid ``0, T, 2T, ...`` of the driver's clock (``now_s``), and a poll's
values are the cluster snapshot of the first tick at or after its grid time (at most one
decode step late; the simulator ticks at step boundaries). ``T = 0`` polls at every
tick (the rule with exact, fresh loads).

Pure: no clock of its own, no I/O; the driver's ``now_s`` is the only time it sees.
"""

from __future__ import annotations

import math

import numpy as np

from br_serve.core.types import UNLIMITED_TOKENS, ClusterSnapshot


class LoadPoll:
    """The last polled copy of every rank's load, and when it was taken.

    ``used_tokens[g]``: KV tokens in use on rank ``g`` (SGLang's ``num_used_tokens``;
    the snapshot's ``load_tokens``). ``running[g]``: its running requests.
    ``kv_usage[g]``: ``used / kv_limit`` (0 where the rank has no KV limit: the
    simulator's default, so a KV-pressure term vanishes there). ``gen_tok_s[g]``: the
    rank's decode rate, ``running / step time`` with the step time of the snapshot's
    cost model (all ranks share the barrier's step, so a rank's rate is proportional to
    its batch).
    """

    def __init__(self, refresh_s: float) -> None:
        if not refresh_s >= 0 or not math.isfinite(refresh_s):
            raise ValueError(f"load_refresh_s: must be a finite number >= 0 (got {refresh_s})")
        self.refresh_s = refresh_s
        self._slot: int | None = None
        self.used_tokens: list[int] = []
        self.running: list[int] = []
        self.kv_usage: list[float] = []
        self.gen_tok_s: list[float] = []

    def refresh(self, cluster: ClusterSnapshot, now_s: float) -> bool:
        """Take a poll if one is due at ``now_s``; True if it was taken."""
        slot = -1 if self.refresh_s == 0 else int(now_s // self.refresh_s)
        if self._slot is not None and slot != -1 and slot <= self._slot:
            return False
        self._slot = slot
        load = cluster.load_tokens
        run = cluster.running_requests
        lim = cluster.kv_limit_tokens
        self.used_tokens = load.tolist()
        self.running = run.tolist()
        self.kv_usage = np.where(lim < UNLIMITED_TOKENS, load / lim, 0.0).tolist()
        alive = cluster.alive
        per = (cluster.step_a_s_per_token * load + cluster.step_c_s_per_request * run
               + cluster.step_b_s)
        tau = float(per[alive].max()) if alive.any() else 0.0
        self.gen_tok_s = (run / tau if tau > 0 else np.zeros_like(per)).tolist()
        return True
