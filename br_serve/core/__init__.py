"""Pure scheduling core: no Ray, no asyncio, no I/O, no pydantic. Numpy and the standard
library only (enforced by the import contracts in pyproject.toml).

Public surface: the messages in :mod:`br_serve.core.types`, :class:`PromptPool`, the
policy interface and registry (:func:`build_policy`, :class:`PolicyBase`,
:func:`register_policy`), frozen option dataclasses (:mod:`br_serve.core.options`), the
generic :class:`Registry` and the predictor contract.
"""

from br_serve.core.options import ConfigError, NoOptions, Options, option, parse_options
from br_serve.core.policy import (
    POLICIES,
    Policy,
    PolicyBase,
    PolicyContext,
    PolicyNeeds,
    build_policy,
    parse_policy_options,
    policy_class,
    policy_names,
    predictor_horizon,
    register_policy,
)
from br_serve.core.pool import PoolFullError, PromptPool
from br_serve.core.predictor import (
    FinishedRequests,
    OracleHook,
    Prediction,
    SurvivesWindow,
    TerminationPredictor,
)
from br_serve.core.registry import Registry
from br_serve.core.types import (
    UNLIMITED_TOKENS,
    Assignment,
    ClusterSnapshot,
    PoolRequest,
    RunningRequests,
    TickResult,
)

__all__ = [
    "POLICIES",
    "UNLIMITED_TOKENS",
    "Assignment",
    "ClusterSnapshot",
    "ConfigError",
    "FinishedRequests",
    "NoOptions",
    "Options",
    "OracleHook",
    "Policy",
    "PolicyBase",
    "PolicyContext",
    "PolicyNeeds",
    "PoolFullError",
    "PoolRequest",
    "Prediction",
    "PromptPool",
    "Registry",
    "RunningRequests",
    "SurvivesWindow",
    "TerminationPredictor",
    "TickResult",
    "build_policy",
    "option",
    "parse_options",
    "parse_policy_options",
    "policy_class",
    "policy_names",
    "predictor_horizon",
    "register_policy",
]
