"""Per-replica step-time perturbations of the simulator: drift and noise.

Real replicas are not the step model: a chip throttles, a host gets a noisy neighbour,
steps jitter. The simulator models two such effects, each a multiplicative factor on a
replica's modelled step time ``a_g L_g + c_g N_g + b_g`` at decode step ``k``:

- **drift**: ``(replica, from_step, factor)`` entries; from ``from_step`` on, that
  replica's steps take ``factor`` times as long (factors of several entries multiply);
- **noise**: an independent lognormal factor per replica and step with mean 1 and
  coefficient of variation ``noise_cv``.

Both are functions of ``(seed, replica, step)`` only, never of what a policy did, so
every policy of a paired comparison sees the same perturbations (common random
numbers): noise is drawn in fixed blocks of steps, block ``j`` from a generator seeded
with ``(seed, j)``.
"""

from __future__ import annotations

import numpy as np

_BLOCK = 4096


class StepPerturbation:
    """Factors ``(G, n)`` for steps ``step .. step + n - 1`` (see the module docstring).

    Raises:
        ValueError: a drift entry names a replica outside ``[0, G)``, a negative step or
            a non-positive factor; ``noise_cv < 0``.
    """

    def __init__(self, replicas: int, drift: tuple[tuple[int, int, float], ...] = (),
                 noise_cv: float = 0.0, seed: int = 0) -> None:
        for g, k, f in drift:
            if not 0 <= g < replicas:
                raise ValueError(f"step_drift: replica {g} outside [0, {replicas})")
            if k < 0 or f <= 0:
                raise ValueError(f"step_drift: need from_step >= 0 and factor > 0 "
                                 f"(got {(g, k, f)})")
        if noise_cv < 0:
            raise ValueError(f"step_noise_cv: must be >= 0 (got {noise_cv})")
        self.g = replicas
        self.drift = tuple(sorted(drift, key=lambda e: e[1]))
        self.noise_cv = noise_cv
        self.seed = seed
        # lognormal with mean 1 and the given CV: sigma^2 = log(1 + cv^2), mu = -sigma^2/2
        self._sigma = float(np.sqrt(np.log1p(noise_cv**2)))
        self._blocks: dict[int, np.ndarray] = {}

    @property
    def active(self) -> bool:
        return bool(self.drift) or self.noise_cv > 0

    def factors(self, step: int, n: int) -> np.ndarray:
        """Multiplicative factors, shape ``(G, n)``, for ``n`` steps from ``step``."""
        out = np.ones((self.g, n))
        ks = np.arange(step, step + n)
        for g, k0, f in self.drift:
            if k0 < step + n:
                out[g, ks >= k0] *= f
        if self.noise_cv > 0:
            out *= self._noise(step, n)
        return out

    def _noise(self, step: int, n: int) -> np.ndarray:
        first, last = step // _BLOCK, (step + n - 1) // _BLOCK
        parts = [self._block(j) for j in range(first, last + 1)]
        cat = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        off = step - first * _BLOCK
        return cat[:, off:off + n]

    def _block(self, j: int) -> np.ndarray:
        got = self._blocks.get(j)
        if got is None:
            rng = np.random.default_rng((self.seed, j))
            s = self._sigma
            got = np.exp(rng.normal(-s * s / 2, s, (self.g, _BLOCK)))
            if len(self._blocks) > 8:  # steps only move forward: drop old blocks
                self._blocks.pop(min(self._blocks))
            self._blocks[j] = got
        return got
