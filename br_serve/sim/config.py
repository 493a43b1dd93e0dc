"""Simulator configuration: validated once at the edge, immutable afterwards."""

from __future__ import annotations

from typing import Any

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

    @model_validator(mode="after")
    def _drift_replicas(self) -> SimConfig:
        for g, k, f in self.step_drift:
            if not 0 <= g < self.replicas or k < 0 or f <= 0:
                raise ValueError(f"step_drift: ({g}, {k}, {f}) needs 0 <= replica < "
                                 f"{self.replicas}, from_step >= 0 and factor > 0")
        return self

    @property
    def label(self) -> str:
        """``policy`` or ``policy+predictor`` (the name used in tables and plots)."""
        return self.policy if self.predictor is None else f"{self.policy}+{self.predictor}"


def parse_sim_config(**fields: Any) -> SimConfig:
    """Build a :class:`SimConfig`; errors are ``ConfigError("<field>: <reason>")``."""
    return validated(SimConfig, fields)
