"""Validated, immutable configuration shared by the edges (simulator, serving graph).

:class:`ClusterConfig` is the one description of a decode cluster and its router that
the simulator's :class:`~br_serve.sim.config.SimConfig` and the serving graph's
:class:`~br_serve.serve.config.GraphConfig` both extend: one name per concept
everywhere. Pydantic lives here and at the other edges, never in ``br_serve.core``.
"""

from br_serve.config.cluster import ClusterConfig, PrefillModel, StepModel
from br_serve.config.errors import describe_validation_error, validated

__all__ = ["ClusterConfig", "PrefillModel", "StepModel", "describe_validation_error",
           "validated"]
