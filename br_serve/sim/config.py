"""Simulator configuration: validated once at the edge, immutable afterwards."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from br_serve.config import ClusterConfig, validated


class SimConfig(ClusterConfig):
    """One simulated run: the cluster of :class:`~br_serve.config.ClusterConfig` plus the
    simulator's own knobs.

    Prefill (trace-timed mode only): ``prefill_replicas`` FIFO servers, each taking
    ``prefill_p0_s + prefill_p1_s_per_token * s`` seconds for a prompt of ``s`` tokens;
    a full prompt pool (``pool_capacity``) stalls the instance holding a finished prefill.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kv_limit_tokens: int | None = Field(default=None, ge=1)
    """KV tokens per replica; bounds admission (prompt tokens vs. room) only: decode
    growth past it is not preempted. None: unlimited."""
    saturated: bool = False
    """Every request is already prefilled at t = 0 (the paper's setting); the pool is
    topped up from the backlog up to ``pool_capacity`` whenever it has room."""
    pool_capacity: int = Field(default=65536, ge=1)
    """Prompt pool bound (a full pool stalls prefill)."""
    max_stretch_steps: int = Field(default=4096, ge=1)
    """Longest run of steps simulated in one vectorised stretch."""
    admit_delay_steps: int = Field(default=0, ge=0, le=64)
    """Steps between a request's assignment and its first decode step, during which it
    holds its slot (and counts in the policy's view) but neither decodes nor loads the
    step. 0 is the paper's model; the Ray graph has 1 (the tick follows the step's
    reports while the next step already runs, and the KV pull overlaps it)."""

    step_drift: tuple[tuple[int, int, float], ...] = ()
    """``(replica, from_step, factor)`` entries: from that decode step on, the replica's
    steps take ``factor`` times as long (a slower chip, throttling, a noisy neighbour)."""
    step_noise_cv: float = Field(default=0.0, ge=0)
    """Coefficient of variation of an independent lognormal factor (mean 1) on each
    replica's step time, per step; the same for every policy of a seed."""

    dyntralb_bubble_threshold_blocks: float | None = Field(default=None, gt=0)
    """DyntraLB on the decode ranks (vllm-ascend's ``bubble_threshold``; default there
    5.0): plans pause and admit requests until ``max - mean`` of the ranks' running KV
    blocks is under it (a value below 1 is the ratio ``(max - mean) / max``). None: off
    (docs/simulator.md, "DyntraLB")."""
    dyntralb_block_tokens: int = Field(default=128, ge=1)
    """Tokens per KV block, DyntraLB's load unit (vllm-ascend's block size, 128)."""
    dyntralb_mode: Literal["static", "dynamic"] = "dynamic"
    """``dynamic`` (vllm-ascend's default): plan only after a request longer than
    ``dyntralb_long_request_blocks`` was bound; ``static``: plan on every step."""
    dyntralb_start_step: int = Field(default=250, ge=0)
    """First step of a busy period after which plans are made (vllm-ascend: 250)."""
    dyntralb_long_request_blocks: int = Field(default=700, ge=0)
    """Dynamic mode: blocks a newly bound request must exceed to activate it (700)."""
    dyntralb_dynamic_max_steps: int = Field(default=256, ge=1)
    """Dynamic mode: active steps without a new long request before it switches off."""
    dyntralb_waiting_per_rank: int | None = Field(default=None, ge=1)
    """Bound requests a rank holds beyond its ``slots`` running ones (its local queue,
    DyntraLB's admission candidates; the router's policy sees ``slots`` plus this).
    None: ``slots`` (vllm-ascend gathers up to twice ``max_num_seqs`` per rank)."""

    @model_validator(mode="after")
    def _dyntralb_alone(self) -> SimConfig:
        if self.dyntralb_bubble_threshold_blocks is not None and self.admit_delay_steps:
            raise ValueError("dyntralb_bubble_threshold_blocks: DyntraLB is not modelled "
                             "with admit_delay_steps > 0 (set one of them to its default)")
        return self

    @property
    def dyntralb(self) -> bool:
        """Whether the decode ranks run DyntraLB."""
        return self.dyntralb_bubble_threshold_blocks is not None

    @property
    def rank_capacity(self) -> int:
        """Requests a rank holds bound: ``slots``, plus its DyntraLB waiting queue."""
        if not self.dyntralb:
            return self.slots
        return self.slots + (self.dyntralb_waiting_per_rank or self.slots)

    @model_validator(mode="after")
    def _drift_replicas(self) -> SimConfig:
        for g, k, f in self.step_drift:
            if not 0 <= g < self.replicas or k < 0 or f <= 0:
                raise ValueError(f"step_drift: ({g}, {k}, {f}) needs 0 <= replica < "
                                 f"{self.replicas}, from_step >= 0 and factor > 0")
        return self

    @property
    def label(self) -> str:
        """``policy`` or ``policy+predictor`` (the name used in tables and plots),
        ``+dyntralb`` when the ranks run DyntraLB."""
        name = self.policy if self.predictor is None else f"{self.policy}+{self.predictor}"
        return f"{name}+dyntralb" if self.dyntralb else name


#: SimConfig fields ``--engine-option`` may set: the decode ranks' own scheduling.
ENGINE_FIELDS = frozenset({
    "dyntralb_bubble_threshold_blocks", "dyntralb_block_tokens", "dyntralb_mode",
    "dyntralb_start_step", "dyntralb_long_request_blocks", "dyntralb_dynamic_max_steps",
    "dyntralb_waiting_per_rank"})


def parse_sim_config(**fields: Any) -> SimConfig:
    """Build a :class:`SimConfig`; errors are ``ConfigError("<field>: <reason>")``."""
    return validated(SimConfig, fields)
