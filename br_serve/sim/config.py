"""Simulator configuration: validated once at the edge, immutable afterwards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from br_serve.config import ClusterConfig, Section
from br_serve.config.tree import parse_config


class SimulatorConfig(Section):
    """The simulator's own knobs (the ``sim`` section)."""

    saturated: bool = False
    """Every request is already prefilled at t = 0 (the paper's setting); the pool is
    topped up from the backlog up to ``pool.capacity`` whenever it has room."""
    max_stretch_steps: int = Field(default=4096, ge=1)
    """Longest run of steps simulated in one vectorised stretch."""
    admit_delay_steps: int = Field(default=0, ge=0, le=64)
    """Steps between a request's assignment and its first decode step, during which it
    holds its slot (and counts in the policy's view) but neither decodes nor loads the
    step. 0 is the paper's model; the Ray graph has 1 (the tick follows the step's
    reports while the next step already runs, and the KV pull overlaps it)."""
    dispatch_ahead: int = Field(default=0, ge=0, le=1024)
    """The graph's ``pool.dispatch_ahead`` with a remote engine: each rank's engine
    queues up to this many bound requests beyond its ``slots`` (FIFO: a queued one
    starts at the step where a running one leaves), and each tick offers the policy
    places as the graph's scheduler does (br_serve/core/ahead.py: free engine
    slots first, queue places only for the pool's backlog beyond this many per rank).
    The policy's snapshot tells queued requests apart. 0: no engine queue."""
    tick_per_delivery: bool = False
    """Trace-timed mode: the policy ticks once per request that lands in the pool, in
    finishing order, as the Ray scheduler does (each submit wakes its tick), instead of
    once per step boundary over every prefill finished since the last one. Requests
    that arrive together (a trace's clump) then reach the policy one at a time, as
    they do live (docs/simulator.md, "Ticks per step or per delivery")."""
    step_drift: tuple[tuple[int, int, float], ...] = ()
    """``(replica, from_step, factor)`` entries: from that decode step on, the replica's
    steps take ``factor`` times as long (a slower chip, throttling, a noisy neighbour);
    on a command line ``REPLICA@STEPxFACTOR``, comma-separated."""
    step_noise_cv: float = Field(default=0.0, ge=0)
    """Coefficient of variation of an independent lognormal factor (mean 1) on each
    replica's step time, per step; the same for every policy of a seed."""

    @model_validator(mode="after")
    def _per_delivery_timed(self) -> SimulatorConfig:
        if self.tick_per_delivery and self.saturated:
            raise ValueError("sim.tick_per_delivery: only in trace-timed mode (a saturated "
                             "run tops the pool up from its backlog; set sim.saturated=false "
                             "or leave tick_per_delivery off)")
        return self

    @field_validator("step_drift", mode="before")
    @classmethod
    def _drift_text(cls, v: Any) -> Any:
        if isinstance(v, str):  # "3@5000x2.0,1@0x1.5" from a command line
            return tuple(_drift(x.strip()) for x in v.split(",") if x.strip())
        return v


def _drift(text: str) -> tuple[int, int, float]:
    """``"G@STEPxF"`` -> ``(G, STEP, F)``."""
    try:
        g, rest = text.split("@", 1)
        step, factor = rest.split("x", 1)
        return int(g), int(step), float(factor)
    except ValueError:
        raise ValueError(f"expected REPLICA@STEPxFACTOR, e.g. 3@5000x2.0, got {text!r}") \
            from None


class DyntraLBConfig(Section):
    """DyntraLB on the simulated decode ranks (the ``dyntralb`` section; docs/simulator.md,
    "DyntraLB"): vllm-ascend's in-engine balancer, an option of the ranks, usable under
    any routing policy."""

    bubble_threshold_blocks: float | None = Field(default=None, gt=0)
    """DyntraLB on the decode ranks (vllm-ascend's ``bubble_threshold``; default there
    5.0): plans pause and admit requests until ``max - mean`` of the ranks' running KV
    blocks is under it (a value below 1 is the ratio ``(max - mean) / max``). None: off
    (docs/simulator.md, "DyntraLB")."""
    block_tokens: int = Field(default=128, ge=1)
    """Tokens per KV block, DyntraLB's load unit (vllm-ascend's block size, 128)."""
    mode: Literal["static", "dynamic"] = "dynamic"
    """``dynamic`` (vllm-ascend's default): plan only after a request longer than
    ``long_request_blocks`` was bound; ``static``: plan on every step."""
    start_step: int = Field(default=250, ge=0)
    """First step of a busy period after which plans are made (vllm-ascend: 250)."""
    long_request_blocks: int = Field(default=700, ge=0)
    """Dynamic mode: blocks a newly bound request must exceed to activate it (700)."""
    dynamic_max_steps: int = Field(default=256, ge=1)
    """Dynamic mode: active steps without a new long request before it switches off."""
    waiting_per_rank: int | None = Field(default=None, ge=1)
    """Bound requests a rank holds beyond its ``slots`` running ones (its local queue,
    DyntraLB's admission candidates; the router's policy sees ``slots`` plus this).
    None: ``slots`` (vllm-ascend gathers up to twice ``max_num_seqs`` per rank)."""

    @property
    def on(self) -> bool:
        """Whether the decode ranks run DyntraLB."""
        return self.bubble_threshold_blocks is not None


def with_dispatch_ahead(overrides: Mapping[str, Any], depth: int) -> dict[str, Any]:
    """``overrides`` (a config mapping) with ``sim.dispatch_ahead = depth`` merged into
    its ``sim`` section: the graph's engine queue and its way of offering places."""
    if depth < 0:
        raise ValueError(f"engine_queue: must be >= 0 (got {depth})")
    out = dict(overrides)
    out["sim"] = {**dict(out.get("sim") or {}), "dispatch_ahead": depth}
    return out


class SimConfig(ClusterConfig):
    """One simulated run: the cluster of :class:`~br_serve.config.ClusterConfig` plus the
    simulator's own section ``sim``.

    Prefill (trace-timed mode only): ``prefill.replicas`` FIFO servers, each taking
    ``prefill.p0_s + prefill.p1_s_per_token * s`` seconds for a prompt of ``s`` tokens;
    a full prompt pool (``pool.capacity``) stalls the instance holding a finished prefill.
    """

    sim: SimulatorConfig = SimulatorConfig()
    """The simulator's own knobs."""
    dyntralb: DyntraLBConfig = DyntraLBConfig()
    """DyntraLB on the decode ranks (off unless ``bubble_threshold_blocks`` is set)."""

    @model_validator(mode="after")
    def _dyntralb_alone(self) -> SimConfig:
        if self.dyntralb.on and self.sim.admit_delay_steps:
            raise ValueError("dyntralb.bubble_threshold_blocks: DyntraLB is not modelled "
                             "with sim.admit_delay_steps > 0 (set one of them to its "
                             "default)")
        if self.sim.dispatch_ahead and (self.dyntralb.on or self.sim.admit_delay_steps):
            raise ValueError("sim.dispatch_ahead: the graph's engine queue is not modelled "
                             "with DyntraLB (dyntralb.bubble_threshold_blocks) or "
                             "sim.admit_delay_steps > 0 (set one of them to its default)")
        return self

    @property
    def rank_capacity(self) -> int:
        """Requests a rank holds bound: ``slots``, plus its engine queue
        (``sim.dispatch_ahead``) or its DyntraLB waiting queue."""
        if self.sim.dispatch_ahead:
            return self.slots + self.sim.dispatch_ahead
        if not self.dyntralb.on:
            return self.slots
        return self.slots + (self.dyntralb.waiting_per_rank or self.slots)

    @model_validator(mode="after")
    def _drift_replicas(self) -> SimConfig:
        for g, k, f in self.sim.step_drift:
            if not 0 <= g < self.replicas or k < 0 or f <= 0:
                raise ValueError(f"sim.step_drift: ({g}, {k}, {f}) needs 0 <= replica < "
                                 f"{self.replicas}, from_step >= 0 and factor > 0")
        return self

    @property
    def label(self) -> str:
        """``policy`` or ``policy+predictor`` (the name used in tables and plots),
        ``+dyntralb`` when the ranks run DyntraLB."""
        name = self.policy.name
        name = name if self.predictor.name is None else f"{name}+{self.predictor.name}"
        return f"{name}+dyntralb" if self.dyntralb.on else name


#: SimConfig sections ``--engine-option`` may set: the decode ranks' own scheduling.
ENGINE_FIELDS = frozenset({"dyntralb"})


def parse_sim_config(data: Mapping[str, Any] | SimConfig | None = None,
                     **fields: Any) -> SimConfig:
    """Build a :class:`SimConfig` from ``data`` and ``fields`` (nested, dotted or flat
    names: ``step_b_s=0.02`` is ``step.b_s``); errors are
    ``ConfigError("<path>: <reason>")``."""
    return parse_config(SimConfig, data, **fields)
