"""The decode step-time model, one value type wherever the coefficients travel.

Replica ``g`` takes ``t_g = a_g L_g + c_g N_g + b_g`` seconds for one decode step, where
``L_g`` is its KV load in tokens and ``N_g`` its running requests; a lock-step step takes
the maximum over the alive replicas. :class:`StepModel` holds ``(a, b, c)`` in that order
everywhere (configuration, simulator, scheduler mirror and calibrator prior, emulated
engine), each coefficient one value for every replica or one value per replica.

It is an :class:`~br_serve.core.options.Options` class, so loose input (``"1e-6,2e-6"``
from a command line, a YAML list) is validated and coerced by
:func:`~br_serve.core.options.parse_options` like any other options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from br_serve.core.options import ConfigError, Options, option
from br_serve.core.types import FloatArray

Coef = float | tuple[float, ...]


def per_replica(v: Coef, replicas: int, name: str = "value") -> tuple[float, ...]:
    """One float per replica: ``v`` itself if it is one per replica, else copies.

    Raises:
        ConfigError: a tuple whose length is not ``replicas`` (named ``name``).
    """
    if isinstance(v, tuple):
        if len(v) != replicas:
            raise ConfigError(f"{name}: {len(v)} values for {replicas} replicas")
        return tuple(float(x) for x in v)
    return (float(v),) * replicas


@dataclass(frozen=True, slots=True)
class StepModel(Options):
    """``(a, b, c)`` of the step time ``a L + c N + b`` (see the module docstring)."""

    a_s_per_token: Coef = option(5e-7, ge=0, doc="seconds per KV token of the replica's "
                                 "load (a); one value, or one per replica")
    b_s: Coef = option(0.03, ge=0, doc="seconds per step independent of load (b); one "
                       "value, or one per replica")
    c_s_per_request: Coef = option(0.0, ge=0, doc="seconds per running request (c, the "
                                   "batch-size term); one value, or one per replica")

    def check(self) -> None:
        for name in ("a_s_per_token", "b_s", "c_s_per_request"):
            if getattr(self, name) == ():
                raise ConfigError(f"{name}: give one value, or one per replica")

    def for_replicas(self, replicas: int) -> StepModel:
        """The same model with every coefficient one value per replica.

        Raises:
            ConfigError: a per-replica coefficient of another length (named).
        """
        return StepModel(per_replica(self.a_s_per_token, replicas, "a_s_per_token"),
                         per_replica(self.b_s, replicas, "b_s"),
                         per_replica(self.c_s_per_request, replicas, "c_s_per_request"))

    def arrays(self, replicas: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(a, b, c)`` as float64 arrays of shape ``(replicas,)``."""
        m = self.for_replicas(replicas)
        return (np.asarray(m.a_s_per_token, dtype=np.float64),
                np.asarray(m.b_s, dtype=np.float64),
                np.asarray(m.c_s_per_request, dtype=np.float64))

    def replica(self, g: int, replicas: int) -> StepModel:
        """Replica ``g``'s coefficients, one value each."""
        m = self.for_replicas(replicas)
        assert isinstance(m.a_s_per_token, tuple) and isinstance(m.b_s, tuple)
        assert isinstance(m.c_s_per_request, tuple)
        return StepModel(m.a_s_per_token[g], m.b_s[g], m.c_s_per_request[g])

    def scaled(self, factor: float | Sequence[float], replicas: int) -> StepModel:
        """Every coefficient of replica ``g`` times ``factor`` (or ``factor[g]``)."""
        f = np.broadcast_to(np.asarray(factor, dtype=np.float64), (replicas,))
        a, b, c = self.arrays(replicas)
        return StepModel(tuple((a * f).tolist()), tuple((b * f).tolist()),
                         tuple((c * f).tolist()))

    def scalar(self) -> tuple[float, float, float]:
        """``(a, b, c)`` of a one-replica model (each coefficient a single value).

        Raises:
            ConfigError: a coefficient with several values.
        """
        out = []
        for name in ("a_s_per_token", "b_s", "c_s_per_request"):
            v = getattr(self, name)
            if isinstance(v, tuple):
                if len(v) != 1:
                    raise ConfigError(f"{name}: one value expected (got {len(v)})")
                v = v[0]
            out.append(float(v))
        return out[0], out[1], out[2]
