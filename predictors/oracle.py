"""Oracle predictor: the true remaining steps (simulator only; the upper bound).

Reads ``RunningRequests.true_remaining_steps``, which ``ClusterState.snapshot(oracle=True)``
fills from the targets. On a real cluster the field is absent and ``predict`` raises
``ValueError`` (BR-H then falls back to the closed gate).
"""

from __future__ import annotations

from br_serve.core.predictor import OracleHook


class OraclePredictor(OracleHook):
    """``p_fin = 1`` exactly when ``remaining <= H``; ``mu_rem`` = the true remainder."""

    name = "oracle"
