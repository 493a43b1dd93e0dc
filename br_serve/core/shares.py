"""How busy and how load-dominated a cluster snapshot is: the bounded hold's gates
(:func:`br_serve.core.tick.run_two_stage`, docs/core.md, "Bounded hold")."""

from __future__ import annotations

from br_serve.core.types import UNLIMITED_TOKENS, ClusterSnapshot


def busy_share(cluster: ClusterSnapshot) -> float:
    """How busy the alive replicas are: the larger of the running share of their slots
    and the used share of their KV limits (where every alive replica has one). Real
    ranks are often KV-bound: a rank whose KV is full runs fewer requests than it has
    slots, and the slot share alone would call it idle. 0 with no alive slot."""
    alive = cluster.alive
    slots = int(cluster.slots[alive].sum())
    if slots <= 0:
        return 0.0
    share = float(cluster.running_requests[alive].sum()) / slots
    kv = cluster.kv_limit_tokens[alive]
    if kv.size and bool((kv < UNLIMITED_TOKENS).all()):
        share = max(share, float(cluster.load_tokens[alive].sum()) / float(kv.sum()))
    return share


def load_share(cluster: ClusterSnapshot) -> float:
    """The share of the cluster's step that balance can move: on the alive replica
    with the longest modelled step ``a_g L_g + c_g N_g + b_g`` (the barrier), the
    load terms ``a_g L_g + c_g N_g`` over the whole step, with the running load.
    Where the fixed cost ``b_g`` dominates (few requests per replica, short contexts)
    a better placement barely shortens the step. 0 with no alive replica."""
    alive = cluster.alive
    if not bool(alive.any()):
        return 0.0
    var = (cluster.step_a_s_per_token * cluster.running_load_tokens()
           + cluster.step_c_s_per_request * cluster.running_requests)[alive]
    step = var + cluster.step_b_s[alive]
    g = int(step.argmax())
    return float(var[g] / step[g]) if step[g] > 0 else 0.0
