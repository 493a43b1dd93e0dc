"""Validated, immutable policy configuration (the edge where bad input is rejected).

Every error names the offending field, e.g. ``horizon: must be >= 0 (got -1)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """Invalid configuration; the message starts with the name of the bad field."""


def describe_validation_error(exc: ValidationError, owner: str = "") -> str:
    """``"[owner.]<field>: <reason> (got <value>)"`` for the first error of ``exc``.

    A cross-field check has no location; its own message names the fields, so it is
    returned as it is. Every edge of the project formats pydantic errors this way.
    """
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return msg
    field = ".".join(str(p) for p in err["loc"])
    prefix = f"{owner}.{field}" if owner else field
    return f"{prefix}: {msg} (got {err.get('input')!r})"


class PolicyConfig(BaseModel):
    """Options of every policy. Fields a policy does not use are ignored by it.

    ``s_greedy`` and ``beta`` default to ``G`` (the number of replicas) when ``None``.
    Ageing (BR-0 / BR-H): a pool request is assigned first when it has waited longer
    than ``max_wait_s`` or ``max_wait_ticks`` *and* at least ``max_overtakes`` newer
    requests have left the pool before it (see docs/core.md for why both).
    ``gate`` is BR-H's confidence gate on ``p_fin``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str = "br0"
    s_greedy: int | None = Field(default=None, ge=0)
    r_max: int = Field(default=4, ge=1, le=10)
    max_wait_s: float = Field(default=2.0, gt=0)
    max_wait_ticks: int = Field(default=32, ge=1)
    max_overtakes: int = Field(default=1024, ge=0)
    horizon: int = Field(default=80, ge=0, le=4096)
    gamma: float = Field(default=1.0, gt=0, le=1)
    alpha: float = Field(default=1.0, gt=0)
    beta: float | None = Field(default=None, gt=0)
    gate: float = Field(default=0.5, gt=0, le=1)
    predictor_timeout_s: float = Field(default=0.01, gt=0)
    kv_block_tokens: int = Field(default=16, ge=1)
    dynamo_request_weight_blocks: float = Field(default=1.0, ge=0)
    vllm_kv_weight: float = Field(default=6.0, ge=0)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        from br_serve.core.registry import policy_names

        names = policy_names()
        if v not in names:
            raise ValueError(f"unknown policy {v!r}; known: {', '.join(sorted(names))}")
        return v

    def resolved_s_greedy(self, replicas: int) -> int:
        return replicas if self.s_greedy is None else self.s_greedy

    def resolved_beta(self, replicas: int) -> float:
        return float(replicas) if self.beta is None else self.beta


def parse_policy_config(data: Mapping[str, Any] | PolicyConfig | None = None,
                        /, **overrides: Any) -> PolicyConfig:
    """Build a :class:`PolicyConfig`, turning pydantic errors into :class:`ConfigError`.

    Raises:
        ConfigError: ``"<field>: <reason> (got <value>)"`` for the first bad field.
    """
    base: dict[str, Any] = {}
    if isinstance(data, PolicyConfig):
        base = data.model_dump()
    elif data is not None:
        base = dict(data)
    base.update(overrides)
    try:
        return PolicyConfig(**base)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None
