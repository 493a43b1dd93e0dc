"""Deterministic discrete-event simulator of the PD path, driving the core policies.

``simulate(trace, SimConfig(...)) -> SimResult``; ``SimResult.summary()`` gives the
metrics of one run. See docs/simulator.md for the model and its conventions.
"""

from br_serve.sim.config import SimConfig, parse_sim_config
from br_serve.sim.engine import simulate
from br_serve.sim.result import SimResult, StepSeries

__all__ = ["SimConfig", "SimResult", "StepSeries", "parse_sim_config", "simulate"]
