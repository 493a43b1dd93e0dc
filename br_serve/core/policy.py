"""The policy interface, the policy registry and how a policy is built.

A policy is a :class:`PolicyBase` subclass in a module of :mod:`br_serve.core.policies`
(related policies share a module: ``baselines``, ``peers``, ``smg``, ``vllm_router``) or
anywhere, under a qualified name; it declares its frozen ``Options`` dataclass and its
``needs`` and is decorated with :func:`register_policy`. :func:`policy_class` finds the
class by name; :func:`build_policy` builds it from raw options (the tick benchmark,
tests, plugins), while the simulator and the Ray scheduler call the class with the
options their configuration already validated. Every driver asks the class what it
needs; nothing outside the policy's module knows its name.

Contract of :meth:`PolicyBase.schedule`: it must not mutate ``cluster`` or ``pool``
(the caller applies the returned assignments); it obeys the hard limits (a replica
never gets more requests than its free slots, nor prompt tokens beyond
``kv_limit - load``; dead replicas get nothing); assigned ids are distinct and all
come from the pool. State that a policy keeps between ticks (a round-robin cursor)
changes only inside ``schedule``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from br_serve.core.options import NoOptions, Options, parse_options
from br_serve.core.pool import PromptPool
from br_serve.core.predictor import TerminationPredictor
from br_serve.core.registry import Registry
from br_serve.core.types import ClusterSnapshot, TickResult


@dataclass(frozen=True, slots=True)
class PolicyNeeds:
    """What a policy needs from whoever drives it (opt-in capabilities).

    ``running_detail``: per-request rows in ``ClusterSnapshot.running`` (else only
    replica totals are built, which is cheaper). ``predictor``: a termination predictor
    in ``PolicyContext.predictor``; such a policy's options have an int ``horizon``,
    the window the predictor is asked about (:func:`predictor_horizon`).
    ``calibrated_step_costs``: the snapshot's step coefficients (``step_a_s_per_token``,
    ``step_b_s``, ``step_c_s_per_request``) fitted online from measured steps
    (:mod:`br_serve.core.calibration`) rather than the configured ones.
    """

    running_detail: bool = False
    predictor: bool = False
    calibrated_step_costs: bool = False


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may depend on beyond its options: injected, so runs replay exactly."""

    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    predictor: TerminationPredictor | None = None
    clock: Callable[[], float] = time.perf_counter


class Policy(Protocol):
    """What a caller of a policy relies on (see the module docstring)."""

    options: Options
    needs: PolicyNeeds

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult: ...


OptionsT = TypeVar("OptionsT", bound=Options)


class PolicyBase(Generic[OptionsT]):
    """Base class of every policy: its options class and needs as class attributes.

    ``Options`` must be the class ``OptionsT`` names (``class P(PolicyBase[POptions]):
    Options = POptions``); :func:`build_policy` passes a validated instance of it.
    """

    Options: ClassVar[type[Options]] = NoOptions
    needs: ClassVar[PolicyNeeds] = PolicyNeeds()

    def __init__(self, options: OptionsT, context: PolicyContext) -> None:
        self.options = options
        self.context = context

    @classmethod
    def needs_for(cls, options: Any) -> PolicyNeeds:
        """What the policy needs under ``options`` (a capability an option turns on
        extends the class's ``needs``); drivers ask this, not ``needs``."""
        return cls.needs

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult:
        raise NotImplementedError


POLICIES: Registry[type[PolicyBase[Any]]] = Registry("policy", "br_serve.core.policies")
#: ``@register_policy("name")`` on a :class:`PolicyBase` subclass.
register_policy = POLICIES.register


def policy_names() -> frozenset[str]:
    """Every registered policy name (the built-ins included)."""
    return POLICIES.names()


def policy_class(name: str) -> type[PolicyBase[Any]]:
    """The class registered as ``name`` (or a qualified ``package.module.Class``).

    Raises:
        ConfigError: unknown name, or a qualified name that is not a policy class.
    """
    from br_serve.core.options import ConfigError

    cls = POLICIES.get(name)
    if not (isinstance(cls, type) and issubclass(cls, PolicyBase)):
        raise ConfigError(f"policy: {name!r} is not a PolicyBase subclass")
    return cls


def parse_policy_options(name: str, options: Mapping[str, Any] | Options | None = None
                         ) -> Options:
    """Validate ``options`` for policy ``name``.

    Raises:
        ConfigError: unknown policy, unknown option or bad value, named.
    """
    return parse_options(policy_class(name).Options, options)


def predictor_horizon(name: str, options: Options) -> int | None:
    """The horizon policy ``name`` asks its predictor about; None if it uses none."""
    if not policy_class(name).needs.predictor:
        return None
    return int(options.horizon)  # type: ignore[attr-defined]


def build_policy(name: str, options: Mapping[str, Any] | Options | None = None,
                 context: PolicyContext | None = None) -> PolicyBase[Any]:
    """Build policy ``name`` with validated ``options`` and an injected ``context``.

    Raises:
        ConfigError: unknown policy, unknown option or bad value, named.
    """
    cls = policy_class(name)
    return cls(parse_options(cls.Options, options), context or PolicyContext())
