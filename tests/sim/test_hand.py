"""A 2-replica scenario computed by hand (see the docstring of each number)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from br_serve.sim import parse_sim_config, simulate
from br_serve.traces import Trace

# a = 1 ms/token, b = 10 ms, c = 0; prefill free (delivered at arrival).
CFG: dict[str, Any] = dict(
    policy="jsq", replicas=2, slots=1, step_a_s_per_token=1e-3, step_b_s=0.01,
    prefill_replicas=1, prefill_p0_s=0.0, prefill_p1_s_per_token=0.0)


def _trace() -> Trace:
    # r0: s=10, o=2 at t=0; r1: s=4, o=3 at t=0; r2: s=5, o=1 at t=1.
    return Trace.build([0.0, 0.0, 1.0], [10, 4, 5], [2, 3, 1], source="hand")


def test_hand_computed_two_replicas() -> None:
    res = simulate(_trace(), parse_sim_config(**CFG))
    s = res.steps
    # jsq: r0 -> g0, r1 -> g1 (ties to the lowest index); r2 later -> g0 (both idle).
    assert res.replica.tolist() == [0, 1, 0]
    assert res.admit_step.tolist() == [0, 0, 3]
    # Loads per step: (10,4) (11,5) (0,6) | idle until t=1 | (5,0).
    assert s.max_load_tokens.tolist() == [10, 11, 6, 5]
    assert s.sum_load_tokens.tolist() == [14, 16, 6, 5]
    # I = G*M - sum L
    assert s.imbalance_tokens.tolist() == [6, 6, 6, 5]
    # tau = max_g (a L_g + b): 20, 21, 16, 15 ms.
    np.testing.assert_allclose(s.tau_s, [0.020, 0.021, 0.016, 0.015], rtol=0, atol=1e-12)
    # balanced: mean_g (a L_g + b): 17, 18, 13, 12.5 ms.
    np.testing.assert_allclose(s.balanced_tau_s, [0.017, 0.018, 0.013, 0.0125], atol=1e-12)
    assert s.running.tolist() == [2, 2, 1, 1]
    np.testing.assert_allclose(res.step_end_s(), [0.020, 0.041, 0.057, 1.015], atol=1e-12)
    first, fin = res.request_times()
    np.testing.assert_allclose(first, [0.020, 0.020, 1.015], atol=1e-12)
    np.testing.assert_allclose(fin, [0.041, 0.057, 1.015], atol=1e-12)

    out = res.summary()
    assert out["mean_imbalance_tokens"] == pytest.approx(23 / 4)
    assert out["tokens_generated"] == 6
    assert out["throughput_tok_s"] == pytest.approx(6 / 0.072)
    assert out["balanced_bound_tok_s"] == pytest.approx(6 / 0.0605)
    # TPOT: r0 (41-20)/1 = 21 ms, r1 (57-20)/2 = 18.5 ms (r2 has one token: no TPOT).
    assert out["tpot_p50_ms"] == pytest.approx(19.75)
    # TTFT: 20, 20, 15 ms.
    assert out["ttft_p50_ms"] == pytest.approx(20.0)
    assert out["makespan_s"] == pytest.approx(1.015)
    assert out["steps"] == 4 and out["requests_finished"] == 3
    assert out["window_steps"] == 4 and out["drain_steps"] == 0


def test_per_replica_coefficients_and_c() -> None:
    # g1 is twice as slow per token; c = 2 ms per running request.
    cfg = parse_sim_config(**{**CFG, "step_a_s_per_token": (1e-3, 2e-3), "step_b_s": (0.01, 0.0),
                       "step_c_s_per_request": 0.002})
    res = simulate(_trace(), cfg)
    # step0: g0 10+2+10 = 22 ms, g1 8+2+0 = 10 ms; step1: 23 / 12; step2: g0 idle 10 ms
    # (b only), g1 12+2 = 14 ms; step3: g0 5+2+10 = 17 ms, g1 0.
    np.testing.assert_allclose(res.steps.tau_s, [0.022, 0.023, 0.014, 0.017], atol=1e-12)


def test_prefill_delays_and_capacity() -> None:
    # One prefill instance, 0.1 s + 1 ms/token: r0 done 0.11, r1 0.11 + 0.104 = 0.214,
    # r2 starts at max(0.214, 1.0) = 1.0, done 1.105.
    cfg = parse_sim_config(**{**CFG, "prefill_p0_s": 0.1, "prefill_p1_s_per_token": 1e-3})
    res = simulate(_trace(), cfg)
    np.testing.assert_allclose(res.enqueue_s, [0.11, 0.214, 1.105], atol=1e-12)
    first, _ = res.request_times()
    # r0 admitted at 0.11 and decodes alone (s=10): first token at 0.11 + 0.02 = 0.13.
    assert first[0] == pytest.approx(0.13)
    # r0 ends at 0.151; r1 lands at 0.214 with nothing running and is admitted then.
    assert first[1] == pytest.approx(0.214 + 0.014)


def test_full_pool_stalls_prefill() -> None:
    # G=1, B=1, pool of 1, two prefill instances of 0.1 s; steps cost exactly b = 30 ms.
    cfg = parse_sim_config(policy="br0", replicas=1, slots=1, pool_capacity=1,
                           step_a_s_per_token=0.0, step_b_s=0.03, prefill_replicas=2,
                           prefill_p0_s=0.1, prefill_p1_s_per_token=0.0)
    trace = Trace.build([0.0, 0.0, 0.0], [10, 10, 10], [10, 1, 1], source="stall")
    res = simulate(trace, cfg)
    # t=0.1: r0 and r1 finish prefill; r0 takes the pool's one place, r1 waits on its
    # instance; the tick admits r0 and r1 enters. r2 (prefilled on r0's instance from
    # 0.1 to 0.2) finds the pool full until r0 finishes at 0.1 + 10 * 0.03 = 0.4.
    np.testing.assert_allclose(res.enqueue_s, [0.1, 0.1, 0.4], atol=1e-12)
    assert res.admit_step.tolist() == [0, 10, 11]


def test_admission_delay_by_hand() -> None:
    """``sim_admit_delay_steps=1`` (the Ray graph): an assigned request holds its slot for one
    step without decoding or loading it. G=1, 2 slots, a = 1 ms/token, b = 10 ms.
    r0: s=10, o=3 at t=0; r1: s=4, o=1 at t=15 ms (during r0's first step)."""
    tr = Trace.build([0.0, 0.015], [10, 4], [3, 1], source="hand")
    cfg = parse_sim_config(**{**CFG, "replicas": 1, "slots": 2, "sim_admit_delay_steps": 1})
    res = simulate(tr, cfg)
    s = res.steps
    # r0 alone and waiting: the replica idles one b (10 ms, not a busy step); then
    # step 0 (L=10, 20 ms, to 30 ms); r1 was assigned after it, so step 1 runs r0 alone
    # (L=11, 21 ms); step 2 both (L = 12 + 4, 26 ms).
    assert res.admit_step.tolist() == [0, 2]
    assert s.sum_load_tokens.tolist() == [10, 11, 16]
    assert s.running.tolist() == [1, 1, 2]
    np.testing.assert_allclose(s.tau_s, [0.020, 0.021, 0.026], atol=1e-12)
    np.testing.assert_allclose(res.step_end_s(), [0.030, 0.051, 0.077], atol=1e-12)
    first, fin = res.request_times()
    np.testing.assert_allclose(first, [0.030, 0.077], atol=1e-12)
    np.testing.assert_allclose(fin, [0.077, 0.077], atol=1e-12)
    assert res.summary()["throughput_tok_s"] == pytest.approx(4 / 0.067)
    # the paper's model (no delay): r1 joins step 1 (L = 11 + 4)
    now = simulate(tr, parse_sim_config(**{**CFG, "replicas": 1, "slots": 2}))
    assert now.admit_step.tolist() == [0, 1]
    assert now.steps.sum_load_tokens.tolist() == [10, 15, 12]


def test_step_drift_and_noise_are_paired_and_exact() -> None:
    """Drift multiplies one replica's steps from a given step on; noise is a function of
    (seed, replica, step) only, so two policies see the same perturbations."""
    from br_serve.sim.perturb import StepPerturbation

    p = StepPerturbation(2, drift=((1, 3, 2.0),), noise_cv=0.0)
    f = p.factors(0, 6)
    assert f[0].tolist() == [1.0] * 6 and f[1].tolist() == [1, 1, 1, 2, 2, 2]
    noisy = StepPerturbation(3, noise_cv=0.1, seed=7)
    whole = noisy.factors(4090, 20)  # crosses a block boundary
    parts = np.concatenate([StepPerturbation(3, noise_cv=0.1, seed=7).factors(4090, 7),
                            StepPerturbation(3, noise_cv=0.1, seed=7).factors(4097, 13)],
                           axis=1)
    assert np.array_equal(whole, parts)
    big = StepPerturbation(4, noise_cv=0.1, seed=1).factors(0, 4096)
    assert abs(big.mean() - 1) < 0.01 and abs(big.std() / big.mean() - 0.1) < 0.01
    # one replica, one request of s=10, o=4: a=1 ms/token, b=10 ms; 2x from step 2 on
    tr = Trace.build([0.0], [10], [4], source="hand")
    base: dict[str, Any] = dict(policy="jsq", replicas=1, slots=1, step_a_s_per_token=1e-3,
                                step_b_s=0.01, prefill_p0_s=0.0, prefill_p1_s_per_token=0.0)
    slow = simulate(tr, parse_sim_config(**base, sim_step_drift=((0, 2, 2.0),)))
    want = [0.02, 0.021, 2 * 0.022, 2 * 0.023]
    assert np.allclose(slow.steps.tau_s, want)
    with pytest.raises(ValueError, match="step_drift"):
        parse_sim_config(**base, sim_step_drift=((1, 0, 2.0),))
