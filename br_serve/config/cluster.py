"""The decode cluster and its router, as the simulator and the serving graph share it.

Mixins compose :class:`ClusterConfig`: the step-time model (:class:`StepModel`), the
prefill model (:class:`PrefillModel`) and the router (policy, its options, the
predictor). Field names are the same everywhere (``serve run ... step_b_s=0.002`` and
``br-serve sim --step-b 0.002`` set the same field) and unique across the tree.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from br_serve.core.options import ConfigError, Options, as_dict
from br_serve.core.policy import (
    PolicyNeeds,
    parse_policy_options,
    policy_class,
    predictor_horizon,
)

Coef = float | tuple[float, ...]


def per_replica(v: Coef, g: int) -> tuple[float, ...]:
    """One value per replica: ``v`` itself if it is one per replica, else ``g`` copies."""
    return tuple(v) if isinstance(v, tuple) else (float(v),) * g


class StepModel(BaseModel):
    """Decode step time: ``max over alive g of (a_g L_g + c_g N_g + b_g)`` seconds.

    Each coefficient is one value for every replica or one value per replica (a
    heterogeneous cluster); ``L_g`` is the replica's KV load in tokens, ``N_g`` its
    running requests.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    step_a_s_per_token: Coef = 5e-7
    """Seconds per KV token of the replica's load (``a``)."""
    step_b_s: Coef = 0.03
    """Seconds per step independent of load (``b``)."""
    step_c_s_per_request: Coef = 0.0
    """Seconds per running request (``c``, the batch-size term)."""

    @field_validator("step_a_s_per_token", "step_b_s", "step_c_s_per_request", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        if isinstance(v, str) and "," in v:  # "1e-6,2e-6" from a command line
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return tuple(v) if isinstance(v, list) else v

    @field_validator("step_a_s_per_token", "step_b_s", "step_c_s_per_request")
    @classmethod
    def _non_negative(cls, v: Coef) -> Coef:
        vals = v if isinstance(v, tuple) else (v,)
        if not vals or any(x < 0 for x in vals):
            raise ValueError("must be >= 0 (one value, or one per replica)")
        return v

    def coefficients(self, replicas: int) -> tuple[tuple[float, ...], tuple[float, ...],
                                                   tuple[float, ...]]:
        """``(a, b, c)``, each one value per replica."""
        return (per_replica(self.step_a_s_per_token, replicas),
                per_replica(self.step_b_s, replicas),
                per_replica(self.step_c_s_per_request, replicas))


class PrefillModel(BaseModel):
    """Prefill: ``prefill_replicas`` FIFO servers, ``p0 + p1 * s`` seconds per prompt of
    ``s`` tokens (the simulator's model and the emulated engine's prefill time)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    prefill_replicas: int = Field(default=8, ge=1, le=4096)
    """Prefill servers (simulator instances, Serve replicas of the graph)."""
    prefill_p0_s: float = Field(default=0.02, ge=0)
    """Seconds per prefill, independent of the prompt."""
    prefill_p1_s_per_token: float = Field(default=2e-5, ge=0)
    """Seconds per prompt token."""


class ClusterConfig(StepModel, PrefillModel):
    """``replicas`` decode replicas of ``slots`` each, routed by ``policy``.

    ``policy_options`` are validated against the policy's own options class (unknown
    keys and bad values are refused by name); a JSON object string is accepted too.
    ``predictor`` feeds policies that need one (``brh``); the predictor's window is the
    policy's ``horizon`` option.
    """

    replicas: int = Field(default=8, ge=1, le=4096)
    """G: data-parallel decode replicas in lock-step."""
    slots: int = Field(default=16, ge=1, le=65536)
    """B: requests one decode replica runs at most."""
    policy: str = "br0"
    """Registered policy name, or a qualified ``package.module.Class``."""
    policy_options: dict[str, Any] = Field(default_factory=dict)
    """Options of ``policy`` (its Options dataclass's fields)."""
    predictor: str | None = None
    """Termination predictor for policies that need one (None: the closed gate)."""
    predictor_options: dict[str, Any] = Field(default_factory=dict)
    """Options of ``predictor``."""
    predictor_model_path: str | None = None
    """Model file for the ``learned`` predictor."""
    seed: int = 0
    """Seeds every injected random generator."""

    @field_validator("policy_options", "predictor_options", mode="before")
    @classmethod
    def _json_object(cls, v: Any) -> Any:
        if isinstance(v, str):
            text = v.strip()
            if not text:
                return {}
            try:
                v = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"expected a JSON object ({exc})") from None
        if isinstance(v, Options):
            v = as_dict(v)
        return v

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        policy_class(v)  # ConfigError (a ValueError) names the problem
        return v

    @field_validator("predictor")
    @classmethod
    def _known_predictor(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from predictors import PREDICTORS

        PREDICTORS.get(v)  # ConfigError (a ValueError) names the problem
        return v

    @model_validator(mode="after")
    def _cluster_checks(self) -> ClusterConfig:
        for name in ("step_a_s_per_token", "step_b_s", "step_c_s_per_request"):
            v = getattr(self, name)
            if isinstance(v, tuple) and len(v) != self.replicas:
                raise ValueError(f"{name}: {len(v)} values for {self.replicas} replicas")
        try:
            opts = parse_policy_options(self.policy, self.policy_options)
        except ConfigError as exc:
            raise ValueError(f"policy_options.{exc}") from None
        # keep the keys given, with their validated, typed values (a frozen model: set
        # once, here); defaults stay implicit so the options carry over to another policy
        typed = as_dict(opts)
        object.__setattr__(self, "policy_options", {k: typed[k] for k in self.policy_options})
        if self.predictor is not None and not policy_class(self.policy).needs.predictor:
            raise ValueError(f"predictor: policy {self.policy!r} uses no predictor "
                             f"(got {self.predictor!r})")
        return self

    def policy_options_obj(self) -> Options:
        """The validated options object of :attr:`policy`."""
        return parse_policy_options(self.policy, self.policy_options)

    def policy_needs(self) -> PolicyNeeds:
        """What :attr:`policy` needs under its options (``needs_for``): e.g. whether a
        driver must calibrate step coefficients online for it."""
        return policy_class(self.policy).needs_for(self.policy_options_obj())

    def predictor_horizon(self) -> int | None:
        """The window the policy asks its predictor about (None: it uses no predictor)."""
        return predictor_horizon(self.policy, self.policy_options_obj())
