"""The decode cluster and its router, as the simulator and the serving graph share it.

:class:`ClusterConfig` is what both compose: the cluster's size (``replicas``, ``slots``,
``kv_limit_tokens``), the seed, and the sections ``step`` (the step-time model,
:class:`~br_serve.core.step.StepModel`), ``prefill`` (:class:`PrefillConfig`), ``pool``
(:class:`PoolConfig`), ``policy`` (:class:`PolicyConfig`) and ``predictor``
(:class:`PredictorConfig`). Names are paths (``step.b_s``; see
:mod:`br_serve.config.tree`), the same in the simulator, the graph and on every command
line. Validation builds nothing: a predictor is built by the one process that uses it
(:meth:`PredictorConfig.build`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from br_serve.config.tree import Section, options_field
from br_serve.core.options import ConfigError, Options, as_dict
from br_serve.core.policy import (
    PolicyNeeds,
    parse_policy_options,
    policy_class,
    predictor_horizon,
)
from br_serve.core.step import StepModel

if TYPE_CHECKING:
    from br_serve.core.predictor import TerminationPredictor


def _json_object(v: Any) -> Any:
    """A JSON object string (from a command line) -> dict; an options object -> dict."""
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


def _plain(v: Any) -> Any:
    """Nested options objects as dicts (a config dumps to JSON)."""
    return {k: _plain(x) for k, x in as_dict(v).items()} if isinstance(v, Options) else v


def _given(opts: Options, given: dict[str, Any]) -> dict[str, Any]:
    """The keys given, with their validated, typed values; defaults stay implicit so
    the options carry over to another policy or predictor."""
    typed = as_dict(opts)
    return {k: _plain(typed[k]) for k in given}


def _registry_message(exc: ConfigError, family: str) -> str:
    return str(exc).removeprefix(f"{family}: ")


class PrefillConfig(Section):
    """Prefill: ``replicas`` FIFO servers, ``p0_s + p1_s_per_token * s`` seconds for a
    prompt of ``s`` tokens (the simulator's model, and the emulated engine's prefill)."""

    replicas: int = Field(default=8, ge=1, le=4096)
    """Prefill servers (simulator instances; Serve replicas of the graph's Prefill)."""
    p0_s: float = Field(default=0.02, ge=0)
    """Seconds per prefill, independent of the prompt."""
    p1_s_per_token: float = Field(default=2e-5, ge=0)
    """Seconds per prompt token."""


class PoolConfig(Section):
    """The prompt pool: prefilled requests waiting for a decode slot."""

    capacity: int = Field(default=65536, ge=1)
    """Most requests in the pool (a full pool stalls prefill; the graph answers 429)."""


class PolicyConfig(Section):
    """The routing policy and its options."""

    name: str = "br0"
    """Registered policy name, or a qualified ``package.module.Class``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The policy's options (its Options dataclass's fields; a JSON object on a command
    line). Only the keys given are kept, with validated values."""

    @field_validator("options", mode="before")
    @classmethod
    def _loose(cls, v: Any) -> Any:
        return _json_object(v)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        try:
            policy_class(v)
        except ConfigError as exc:
            raise ValueError(_registry_message(exc, "policy")) from None
        return v

    @model_validator(mode="after")
    def _options(self) -> PolicyConfig:
        try:
            opts = parse_policy_options(self.name, self.options)
        except ConfigError as exc:
            raise ValueError(f"options.{exc}") from None
        object.__setattr__(self, "options", _given(opts, self.options))  # frozen: once
        return self

    def parsed(self) -> Options:
        """The validated options object of the policy."""
        return parse_policy_options(self.name, self.options)

    def needs(self) -> PolicyNeeds:
        """What the policy needs under its options (``needs_for``): e.g. whether a driver
        must calibrate step coefficients online for it."""
        return policy_class(self.name).needs_for(self.parsed())

    def horizon(self) -> int | None:
        """The window the policy asks its predictor about (None: it uses none)."""
        return predictor_horizon(self.name, self.parsed())


class PredictorConfig(Section):
    """The termination predictor, for policies that use one (``brh``). Validated
    against the predictor's declared options; built only by :meth:`build`."""

    name: str | None = None
    """Registered predictor name (``survives``, ``survival``, ``exact``, ``learned``,
    ``oracle``), a qualified ``package.module.NAME``, or None (the closed gate)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The predictor's options (a JSON object on a command line)."""
    model_path: str | None = None
    """Model file of a predictor that reads one (``learned``)."""

    @field_validator("options", mode="before")
    @classmethod
    def _loose(cls, v: Any) -> Any:
        return _json_object(v)

    @model_validator(mode="after")
    def _declared(self) -> PredictorConfig:
        from predictors import parse_predictor_options, predictor_kind

        if self.name is None:
            if self.options or self.model_path:
                raise ValueError("name: required with options or model_path")
            return self
        try:
            kind = predictor_kind(self.name)
        except ConfigError as exc:
            raise ValueError(f"name: {_registry_message(exc, 'predictor')}") from None
        try:
            opts = parse_predictor_options(self.name, self.options)
        except ConfigError as exc:
            raise ValueError(f"options.{exc}") from None
        object.__setattr__(self, "options", _given(opts, self.options))
        if kind.model_file and not self.model_path:
            raise ValueError(f"model_path: required by {self.name!r} (a file written by "
                             "`br-serve train-predictor --out FILE`)")
        if self.model_path and not kind.model_file:
            raise ValueError(f"model_path: {self.name!r} reads no model file")
        return self

    @property
    def simulator_only(self) -> bool:
        """It reads true output lengths, which only the simulator knows."""
        from predictors import predictor_kind

        return self.name is not None and predictor_kind(self.name).simulator_only

    def build(self, horizon: int, seed: int) -> TerminationPredictor:
        """The predictor, for the window ``horizon`` of the policy that asks.

        Raises:
            ValueError: no predictor is named, or its model file is unreadable.
            FileNotFoundError: the model file does not exist.
        """
        if self.name is None:
            raise ValueError("predictor.name: none given")
        from predictors import make_predictor

        return make_predictor(self.name, horizon=horizon, model_path=self.model_path,
                              seed=seed, **self.options)


class ClusterConfig(BaseModel):
    """``replicas`` decode replicas of ``slots`` each, routed by ``policy`` (see the
    module docstring). Frozen after validation."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    replicas: int = Field(default=8, ge=1, le=4096)
    """G: data-parallel decode replicas in lock-step."""
    slots: int = Field(default=16, ge=1, le=65536)
    """B: requests one decode replica runs at most."""
    kv_limit_tokens: int | None = Field(default=None, ge=1)
    """KV tokens per decode replica; bounds admission (a prompt must fit the room left)
    only: decode growth past it is not preempted. None: unlimited."""
    seed: int = 0
    """Seeds every injected random generator."""
    step: options_field(StepModel) = StepModel()  # type: ignore[valid-type]
    """The decode step-time model ``a L + c N + b`` (one value, or one per replica)."""
    prefill: PrefillConfig = PrefillConfig()
    """The prefill model."""
    pool: PoolConfig = PoolConfig()
    """The prompt pool."""
    policy: PolicyConfig = PolicyConfig()
    """The routing policy."""
    predictor: PredictorConfig = PredictorConfig()
    """The termination predictor (policies that use one)."""

    @model_validator(mode="before")
    @classmethod
    def _any_spelling(cls, data: Any) -> Any:
        """Dotted and flat names (``step.b_s``, ``step_b_s``) go to their sections."""
        from br_serve.config.tree import nest

        return nest(cls, data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _cluster_checks(self) -> ClusterConfig:
        try:
            self.step.for_replicas(self.replicas)
        except ConfigError as exc:
            raise ValueError(f"step.{exc}") from None
        if self.predictor.name is not None and not policy_class(self.policy.name).needs.predictor:
            raise ValueError(f"predictor.name: policy {self.policy.name!r} uses no predictor "
                             f"(got {self.predictor.name!r})")
        return self

    def step_model(self) -> StepModel:
        """The configured step model, one value per replica."""
        step: StepModel = self.step
        return step.for_replicas(self.replicas)

    def predictor_horizon(self) -> int | None:
        """The window the policy asks its predictor about (None: it uses no predictor)."""
        return self.policy.horizon()

    def build_predictor(self) -> TerminationPredictor | None:
        """The configured predictor for a policy that uses one, else None. Call it in
        the process that runs the policy, once."""
        horizon = self.policy.horizon()
        if self.predictor.name is None or horizon is None:
            return None
        return self.predictor.build(horizon, self.seed)
