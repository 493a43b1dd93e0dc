"""Pure scheduling core: no Ray, no asyncio, no I/O. Numpy and the standard library only.

Public surface: the messages in :mod:`br_serve.core.types`, :class:`PromptPool`,
:class:`PolicyConfig` / :func:`parse_policy_config`, :func:`make_policy` and the
predictor contract.
"""

from br_serve.core.config import ConfigError, PolicyConfig, parse_policy_config
from br_serve.core.pool import PoolFullError, PromptPool
from br_serve.core.predictor import (
    FinishedRequests,
    OracleHook,
    Prediction,
    SurvivesWindow,
    TerminationPredictor,
)
from br_serve.core.registry import Policy, PolicyContext, make_policy, policy_names, register
from br_serve.core.types import (
    UNLIMITED_TOKENS,
    Assignment,
    ClusterSnapshot,
    PoolRequest,
    RunningRequests,
    TickResult,
)

__all__ = [
    "UNLIMITED_TOKENS",
    "Assignment",
    "ClusterSnapshot",
    "ConfigError",
    "FinishedRequests",
    "OracleHook",
    "Policy",
    "PolicyConfig",
    "PolicyContext",
    "PoolFullError",
    "PoolRequest",
    "Prediction",
    "PromptPool",
    "RunningRequests",
    "SurvivesWindow",
    "TerminationPredictor",
    "TickResult",
    "make_policy",
    "parse_policy_config",
    "policy_names",
    "register",
]
