"""The simulator's models of the real routers as bench-peers runs them: binding at
arrival (the router picks the rank when the request arrives, the rank queues it),
vllm-router's PD power-of-two that reads no load, and the routers' round robin."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from br_serve.bench.peers_routers import ARMS, router_command
from br_serve.core import ClusterSnapshot, PolicyContext, PoolRequest, PromptPool, build_policy
from br_serve.core.policy import POLICIES


def _pool(n: int, start: int = 0, prompt: int = 10) -> PromptPool:
    pool = PromptPool(5000)
    for i in range(start, start + n):
        pool.add(PoolRequest(f"r{i}", prompt, enqueued_tick=i))
    return pool


def _pol(name: str, options: Mapping[str, object] | None = None, seed: int = 0) -> object:
    return build_policy(name, options, PolicyContext(rng=np.random.default_rng(seed)))


def _picks(pol: object, cluster: ClusterSnapshot, pool: PromptPool) -> list[tuple[str, int]]:
    res = pol.schedule(cluster, pool, 0.0, 0)  # type: ignore[attr-defined]
    return [(a.request_id, a.replica) for a in res.assignments]


def test_router_round_robin_binds_in_turn_and_waits_for_a_full_rank() -> None:
    pol = _pol("router_round_robin")
    # rank 1 is full: the simulator's round_robin would skip it, the router does not
    c = ClusterSnapshot.build([0, 0, 0], [0, 2, 0], 2)
    assert _picks(pol, c, _pool(6)) == [("r0", 0), ("r2", 2), ("r3", 0), ("r5", 2)]
    late = _picks(_pol("round_robin"), c, _pool(6))
    assert [g for _, g in late] == [0, 2, 0, 2]  # fills 4 slots from the next requests
    # r1 and r4 wait for rank 1; when it frees, they go there, first come first served
    free = ClusterSnapshot.build([0, 0, 0], [2, 0, 2], 2)
    pool = _pool(6)
    for rid in ("r0", "r2", "r3", "r5"):
        pool.remove(rid)
    assert _picks(pol, free, pool) == [("r1", 1), ("r4", 1)]


def test_arrival_binding_counts_bound_waiting_requests_as_in_flight() -> None:
    # one slot per rank, 8 requests: p2c over in-flight counts that include the bound,
    # waiting requests spreads them evenly; reading only running counts it would not
    pol = _pol("vllm_router_p2c", {"bind": "arrival"})
    c = ClusterSnapshot.build([0, 0], [0, 0], 1)
    _picks(pol, c, _pool(8))
    assert sorted(pol._sticky.pending) == [3, 3]  # type: ignore[attr-defined]


def test_vllm_router_pd_power_of_two_is_uniform_random() -> None:
    # every load 0: the first drawn wins, whatever the ranks' loads
    c = ClusterSnapshot.build([0] * 4, [7, 0, 0, 0], 2000)
    n = 4000
    none = Counter(g for _, g in _picks(_pol("vllm_router_p2c", {"p2c_loads": "none"}), c,
                                        _pool(n)))
    assert all(800 <= none[g] <= 1200 for g in range(4)), none
    counted = Counter(g for _, g in _picks(_pol("vllm_router_p2c"), c, _pool(n)))
    assert counted[0] < none[0]  # the in-flight count avoids the loaded rank


def test_bench_arms_model_the_routers_as_run() -> None:
    for arm in ARMS.values():
        assert arm.sim_policy in POLICIES, arm.label
        build_policy(str(arm.sim_policy), dict(arm.sim_options))  # options validate
    assert ARMS["smg:round_robin"].sim_policy == "router_round_robin"
    assert dict(ARMS["vllm-router:power_of_two"].sim_options)["p2c_loads"] == "none"
    # round_robin as the worker policy reads no text: +1 per request between polls
    assert dict(ARMS["smg:min_tokens"].sim_options)["min_tokens_increment"] == "one"
    # smg with --dp-aware polls no decode load: its rank rules run on in-flight counts
    for label in ("smg:power_of_two", "smg:least_load"):
        assert ARMS[label].dp_aware and dict(ARMS[label].sim_options)["load_reports"] == "none"
    assert not ARMS["smg:min_tokens"].dp_aware


def test_router_command_moves_prometheus_off_the_shared_default_port() -> None:
    for label in ("smg:round_robin", "vllm-router:round_robin"):
        cmd = router_command(ARMS[label], 9, "http://127.0.0.1:1", "http://127.0.0.1:2", 4)
        port = int(cmd[cmd.index("--prometheus-port") + 1])
        assert port not in (0, 29000)
        assert cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1"


def test_simulated_windows_average_a_random_rule_over_seeds() -> None:
    import pytest

    from br_serve.bench.peers import Window
    from br_serve.bench.peers_report import SimArm, simulate_windows
    from br_serve.serve.config import parse_graph_config

    base = parse_graph_config(replicas=4, slots=2)
    rng = np.random.default_rng(3)
    wins = [Window(i, 0, tuple([0.0] * 24), tuple(int(x) for x in rng.integers(50, 400, 24)),
                   tuple(int(x) for x in rng.integers(5, 60, 24))) for i in range(2)]
    pols = {"rr": SimArm("router_round_robin"),
            "p2c": SimArm("vllm_router_p2c", {"bind": "arrival", "p2c_loads": "none"})}

    def sim(seeds: int, b: object = base) -> dict[str, Any]:
        return simulate_windows(b, wins, pols, True, say=lambda _: None, seeds=seeds)

    three = sim(3)
    # a deterministic rule: every seed gives the same value
    assert three["rr"]["throughput_tok_s"] == pytest.approx(sim(1)["rr"]["throughput_tok_s"])
    # a random rule: the mean of the single-seed draws, which differ
    draws = [sim(1, parse_graph_config(base, seed=s))["p2c"]["throughput_tok_s"]
             for s in range(3)]
    assert len({tuple(d) for d in draws}) > 1
    for w in range(2):
        assert three["p2c"]["throughput_tok_s"][w] == pytest.approx(
            sum(d[w] for d in draws) / 3)
    assert three["p2c"]["seeds"] == 3
    with pytest.raises(ValueError, match="--sim-seeds"):
        sim(0)


def test_simulated_windows_spread_predictor_and_bound() -> None:
    import pytest

    from br_serve.bench.peers import Window
    from br_serve.bench.peers_report import SimArm, simulate_windows
    from br_serve.serve.config import parse_graph_config

    base = parse_graph_config(replicas=4, slots=2)
    rng = np.random.default_rng(5)
    wins = [Window(0, 0, tuple(float(x) for x in range(24)),
                   tuple(int(x) for x in rng.integers(50, 400, 24)),
                   tuple(int(x) for x in rng.integers(5, 60, 24)))]
    arms = {"rr": SimArm("router_round_robin"),
            "oracle": SimArm("brh", {"trust_decode_share": None}, predictor="exact")}

    def sim(saturated: bool, spread_s: float = 0.0) -> dict[str, Any]:
        return simulate_windows(base, wins, arms, saturated, say=lambda _: None,
                                spread_s=spread_s)

    at_once, spread, timed = sim(True), sim(True, 5.0), sim(False)
    # the predictor reaches the policy and is recorded; a plain arm records none
    assert at_once["oracle"]["predictor"] == "exact" and "predictor" not in at_once["rr"]
    # the bound is the same run with every step priced at the mean rank load
    for r in (at_once, spread, timed):
        for arm in arms:
            assert r[arm]["balanced_bound_tok_s"][0] >= r[arm]["throughput_tok_s"][0] > 0
    # three arrival shapes, three different runs: 24 s of arrivals is slower than 5 s
    thr = [r["rr"]["throughput_tok_s"][0] for r in (at_once, spread, timed)]
    assert len(set(thr)) == 3 and thr[2] < thr[1]
    with pytest.raises(ValueError, match="spread_s"):
        sim(False, 1.0)
    with pytest.raises(ValueError, match="spread_s"):
        sim(True, -1.0)


def test_simulated_windows_model_the_graphs_engine_queue() -> None:
    """The graph runs live with ``pool.dispatch_ahead`` requests queued per rank; the
    simulator models that queue when the arm asks for it, and records the depth."""
    import pytest

    from br_serve.bench.peers_report import SimArm, simulate_windows
    from br_serve.serve.config import parse_graph_config

    base = parse_graph_config(replicas=4, slots=2)
    wins = _random_windows(11, max_output=120)
    arms = {"d0": SimArm("br0"), "d2": SimArm("br0", engine_queue=2)}
    r = simulate_windows(base, wins, arms, True, say=lambda _: None)
    assert (r["d0"]["engine_queue"], r["d2"]["engine_queue"]) == (0, 2)
    # a queue binds ahead against loads that change before the request runs: another run
    assert r["d0"]["mean_imbalance_tokens"] != r["d2"]["mean_imbalance_tokens"]
    with pytest.raises(ValueError, match="engine_queue"):
        SimArm("br0", engine_queue=-1)


def test_simulated_windows_model_the_graphs_turnover_at_depth_zero() -> None:
    """``turnover_steps``: a bound request waits that many engine steps before its first
    decode (the graph's report, tick, admit and install at ``dispatch_ahead`` 0); the
    simulated window then runs slower, and the arm records it. Refused beside a queue."""
    import pytest

    from br_serve.bench.peers_report import SimArm, simulate_windows
    from br_serve.serve.config import parse_graph_config

    base = parse_graph_config(replicas=4, slots=2)
    wins = _random_windows(12, max_output=20)
    arms = {"t0": SimArm("br0"), "t3": SimArm("br0", turnover_steps=3)}
    r = simulate_windows(base, wins, arms, True, say=lambda _: None)
    assert "turnover_steps" not in r["t0"] and r["t3"]["turnover_steps"] == 3
    # short outputs: 3 idle steps per admission cost far more than any placement gains
    assert sum(r["t3"]["throughput_tok_s"]) < 0.9 * sum(r["t0"]["throughput_tok_s"])
    with pytest.raises(ValueError, match="turnover_steps"):
        SimArm("br0", engine_queue=2, turnover_steps=1)
    with pytest.raises(ValueError, match="turnover_steps"):
        SimArm("br0", turnover_steps=-1)


def _random_windows(seed: int, max_output: int) -> list[Any]:
    """Three saturated windows of 40 requests: prompts 50-3999 tokens, outputs 5 to
    ``max_output - 1``."""
    from br_serve.bench.peers import Window

    rng = np.random.default_rng(seed)
    return [Window(i, 0, tuple([0.0] * 40), tuple(int(x) for x in rng.integers(50, 4000, 40)),
                   tuple(int(x) for x in rng.integers(5, max_output, 40))) for i in range(3)]


def test_simulated_windows_tick_per_delivery_as_the_live_scheduler() -> None:
    """``tick_per_delivery`` (bench-peers' default ``--sim-ticks delivery``): a saturated
    window reaches the policy one request at a time. A rule that binds each request by
    itself in arrival order (the routers' round robin) predicts the same either way; the
    graph's br0 with its bounded hold places a batch largest first, and alone on
    balanced ranks a large request is held: another run."""
    from br_serve.bench.peers_report import SimArm, simulate_windows
    from br_serve.serve.config import parse_graph_config

    base = parse_graph_config(replicas=4, slots=2)
    wins = _random_windows(13, max_output=60)
    arms = {"rr": SimArm("router_round_robin"), "br0": SimArm("br0", engine_queue=2)}
    step = simulate_windows(base, wins, arms, True, say=lambda _: None)
    per = simulate_windows(base, wins, arms, True, say=lambda _: None,
                           tick_per_delivery=True)
    assert per["rr"]["throughput_tok_s"] == step["rr"]["throughput_tok_s"]
    assert per["br0"]["ttft_p50_ms"] != step["br0"]["ttft_p50_ms"]
