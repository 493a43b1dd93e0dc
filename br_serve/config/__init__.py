"""Validated, immutable configuration shared by the edges (simulator, serving graph).

:class:`ClusterConfig` is the one description of a decode cluster and its router that
the simulator's :class:`~br_serve.sim.config.SimConfig` and the serving graph's
:class:`~br_serve.serve.config.GraphConfig` both extend, a tree of frozen sections
whose names are paths (``step.b_s``, ``policy.options``): one name per concept
everywhere (:mod:`br_serve.config.tree`). Pydantic lives here and at the other edges,
never in ``br_serve.core``.
"""

from br_serve.config.cluster import (
           ClusterConfig,
           PolicyConfig,
           PoolConfig,
           PredictorConfig,
           PrefillConfig,
)
from br_serve.config.errors import describe_validation_error, validated
from br_serve.config.tree import Section, add_flags, given_flags, leaves, nest, options_field
from br_serve.core.step import StepModel

__all__ = ["ClusterConfig", "PolicyConfig", "PoolConfig", "PredictorConfig", "PrefillConfig",
           "Section", "StepModel", "add_flags", "describe_validation_error", "given_flags",
           "leaves", "nest", "options_field", "validated"]
