"""Deterministic discrete-event simulator of the PD path, driving the core policies.

``simulate(trace, SimConfig(...)) -> SimResult``; ``SimResult.summary()`` gives the
metrics of one run. Comparisons: ``run_ensemble(trace, [RunSpec(cfg), ...], replays=K)``
(paired replays, t-intervals), the stationary saturated protocol (``Stationary``) and
``capacity(trace, specs, SLO(...))``. See docs/simulator.md.
"""

from br_serve.sim.capacity import SLO, Bracket, CapacityResult, capacity
from br_serve.sim.config import SimConfig, parse_sim_config
from br_serve.sim.engine import simulate
from br_serve.sim.ensemble import EnsembleResult, paired_gain, run_ensemble
from br_serve.sim.result import SimResult, StepSeries
from br_serve.sim.runner import RunSpec
from br_serve.sim.stationary import Stationary

__all__ = [
    "SLO",
    "Bracket",
    "CapacityResult",
    "EnsembleResult",
    "RunSpec",
    "SimConfig",
    "SimResult",
    "Stationary",
    "StepSeries",
    "capacity",
    "paired_gain",
    "parse_sim_config",
    "run_ensemble",
    "simulate",
]
