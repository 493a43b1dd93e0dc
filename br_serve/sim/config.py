"""Simulator configuration: validated once at the edge, immutable afterwards."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from br_serve.core.config import describe_validation_error


class SimConfig(BaseModel):
    """One simulated run: a policy (and predictor) on ``replicas`` x ``slots`` decode slots.

    Step time (DESIGN section 2): ``max over alive g of (a_g L_g + c N_g + b_g)`` with
    ``step_a_s_per_token`` / ``step_b_s`` either one value or one per replica.
    Prefill (trace-timed mode only): ``prefill_instances`` FIFO servers, each taking
    ``prefill_p0_s + prefill_p1_s_per_token * s`` seconds for a prompt of ``s`` tokens; a
    full prompt pool (``pool_capacity``) stalls the instance holding a finished prefill.
    ``saturated``: every request is already prefilled at t = 0 (the paper's setting);
    the pool is topped up from the backlog up to ``pool_capacity`` whenever it has room.
    ``kv_limit_tokens`` bounds admission (prompt tokens vs. room) only: decode growth past
    it is not preempted. ``None`` = unlimited.
    ``admit_delay_steps``: steps between a request's assignment and its first decode
    step, during which it holds its slot (and counts in the policy's view) but neither
    decodes nor loads the step. 0 is the paper's model; the Ray graph has 1 (the
    tick follows the step's reports while the next step already runs, and the KV pull
    overlaps it).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str = "br0"
    predictor: str | None = None
    predictor_model_path: str | None = None
    replicas: int = Field(default=8, ge=1, le=4096)
    slots: int = Field(default=16, ge=1, le=65536)
    kv_limit_tokens: int | None = Field(default=None, ge=1)
    horizon: int = Field(default=80, ge=0, le=4096)
    seed: int = 0
    saturated: bool = False
    step_a_s_per_token: float | tuple[float, ...] = 5e-7
    step_b_s: float | tuple[float, ...] = 0.03
    step_c_s_per_request: float = Field(default=0.0, ge=0)
    prefill_instances: int = Field(default=8, ge=1)
    prefill_p0_s: float = Field(default=0.02, ge=0)
    prefill_p1_s_per_token: float = Field(default=2e-5, ge=0)
    pool_capacity: int = Field(default=65536, ge=1)
    max_stretch_steps: int = Field(default=4096, ge=1)
    admit_delay_steps: int = Field(default=0, ge=0, le=64)

    @model_validator(mode="after")
    def _per_replica(self) -> SimConfig:
        for name in ("step_a_s_per_token", "step_b_s"):
            v = getattr(self, name)
            vals = v if isinstance(v, tuple) else (v,)
            if isinstance(v, tuple) and len(v) != self.replicas:
                raise ValueError(f"{name}: {len(v)} values for {self.replicas} replicas")
            if any(x < 0 for x in vals):
                raise ValueError(f"{name}: must be >= 0")
        return self

    @property
    def label(self) -> str:
        """``policy`` or ``policy+predictor`` (the name used in tables and plots)."""
        return self.policy if self.predictor is None else f"{self.policy}+{self.predictor}"


def parse_sim_config(**fields: Any) -> SimConfig:
    """Build a :class:`SimConfig`; errors become ``ValueError("<field>: <reason>")``."""
    try:
        return SimConfig(**fields)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None
