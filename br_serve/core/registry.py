"""Policy interface and the registry that maps names to factories.

A new policy is one module in ``br_serve.core.policies`` with a factory decorated by
:func:`register`, plus an import line in that package's ``__init__``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from br_serve.core.pool import PromptPool
from br_serve.core.predictor import TerminationPredictor
from br_serve.core.types import ClusterSnapshot, TickResult


class Policy(Protocol):
    """A routing policy: snapshot + pool in, assignments out.

    ``schedule`` must not mutate ``cluster`` or ``pool``; the caller applies the
    returned assignments. Every policy obeys the hard limits: a replica never gets more
    requests than its free slots, nor prompt tokens beyond ``kv_limit - load``, and dead
    replicas get nothing. Assigned ids are distinct and all come from the pool.
    """

    name: str

    def schedule(self, cluster: ClusterSnapshot, pool: PromptPool, now_s: float,
                 tick: int) -> TickResult: ...


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may depend on beyond its config: injected, so runs replay exactly."""

    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    predictor: TerminationPredictor | None = None
    clock: Callable[[], float] = time.perf_counter


if TYPE_CHECKING:
    from br_serve.core.config import PolicyConfig

PolicyFactory = Callable[["PolicyConfig", PolicyContext], Policy]

_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class or function decorator: make ``name`` constructible by :func:`make_policy`."""

    def deco(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def policy_names() -> frozenset[str]:
    import br_serve.core.policies  # noqa: F401  (registers the built-ins)

    return frozenset(_REGISTRY)


def make_policy(config: PolicyConfig, context: PolicyContext | None = None) -> Policy:
    """Instantiate the policy ``config.policy`` (already validated by the config)."""
    policy_names()
    return _REGISTRY[config.policy](config, context or PolicyContext())
