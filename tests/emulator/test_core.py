"""The emulator's lock-step core and KV ledger, without HTTP."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.emulator.config import EmulatorConfig
from br_serve.emulator.core import LockstepCore, StepModel, TokenEvent, first_token
from br_serve.emulator.ledger import KVLedger, KVRefused
from br_serve.engine.emulated import token_id, token_text


def run_all(core: LockstepCore) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    while not core.idle():
        plan = core.plan()
        events += core.apply(plan)
    return events


def test_step_lasts_the_slowest_rank_idle_ranks_cost_b() -> None:
    model = StepModel((1e-3, 2e-3, 0.0), (0.01, 0.002, 0.05))
    core = LockstepCore(model, slots=8)
    core.admit("a", 0, prompt_tokens=10, max_tokens=3, seed=1)
    core.admit("b", 1, prompt_tokens=30, max_tokens=3, seed=1)
    plan = core.plan()
    assert plan.loads == (10, 30, 0)
    # rank 0: 0.02, rank 1: 0.062, rank 2 (idle): 0.05
    assert plan.duration_s == pytest.approx(0.062)
    core.apply(plan)
    assert core.plan().loads == (11, 31, 0)


def test_every_running_request_emits_one_token_per_step_and_tokens_are_deterministic() -> None:
    core = LockstepCore(StepModel.uniform(2, 0.0, 0.01), slots=4)
    core.admit("x", 0, prompt_tokens=5, max_tokens=4, seed=7)
    core.admit("y", 1, prompt_tokens=2, max_tokens=2, seed=9)
    per_step = []
    while not core.idle():
        evs = core.apply(core.plan())
        per_step.append(sorted(e.request_id for e in evs))
    assert per_step == [["x", "y"], ["x", "y"], ["x"], ["x"]]
    core2 = LockstepCore(StepModel.uniform(1, 0.0, 0.01), slots=1)
    core2.admit("x", 0, prompt_tokens=5, max_tokens=4, seed=7)
    evs = run_all(core2)
    assert [e.token_id for e in evs] == [token_id(7, 5 + i) for i in range(4)]
    assert [e.text for e in evs] == [token_text(token_id(7, 5 + i)) for i in range(4)]
    assert [e.finished for e in evs] == [False, False, False, True]
    assert first_token(7, 5) == (evs[0].token_id, evs[0].text)
    assert core2.counters[0].tokens == 4 and core2.counters[0].finished == 1


def test_slots_queue_fifo_and_abort_frees_the_slot() -> None:
    core = LockstepCore(StepModel.uniform(1, 0.0, 0.01), slots=1)
    for rid in ("a", "b", "c"):
        core.admit(rid, 0, prompt_tokens=1, max_tokens=2, seed=0)
    plan = core.plan()
    assert plan.running == (("a",),) and core.waiting_count(0) == 2
    assert core.abort("a")  # between plan and apply: emits nothing
    assert core.apply(plan) == []
    assert core.plan().running == (("b",),)
    assert core.abort("c") and not core.abort("c")
    assert [e.request_id for e in run_all(core)] == ["b", "b"]
    assert core.counters[0].aborted == 2 and core.counters[0].admitted == ["a", "b", "c"]


def test_drop_and_stall_a_rank() -> None:
    core = LockstepCore(StepModel.uniform(2, 0.0, 0.01), slots=4)
    core.admit("a", 0, 1, 5, 0)
    core.admit("b", 1, 1, 5, 0)
    core.set_stalled(1, True)
    evs = core.apply(core.plan())
    assert [e.request_id for e in evs] == ["a"]
    assert core.drop_rank(1) == ["b"] and core.rank_of("b") is None
    with pytest.raises(ValueError, match="already running"):
        core.admit("a", 0, 1, 1, 0)
    with pytest.raises(ValueError, match="rank"):
        core.admit("z", 2, 1, 1, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "abort", "step"]), st.integers(0, 3),
                          st.integers(1, 20), st.integers(1, 6)), max_size=60))
def test_load_and_token_accounting_under_random_ops(ops: list[tuple[str, int, int, int]]) -> None:
    core = LockstepCore(StepModel.uniform(4, 1e-4, 0.001), slots=2)
    emitted: dict[str, int] = {}
    prompts: dict[str, int] = {}
    n = 0
    for op, rank, prompt, max_tokens in ops:
        if op == "admit":
            rid = f"r{n}"
            n += 1
            core.admit(rid, rank, prompt, max_tokens, seed=n)
            prompts[rid], emitted[rid] = prompt, 0
        elif op == "abort" and prompts:
            rid = sorted(prompts)[rank % len(prompts)]
            core.abort(rid)
            del prompts[rid]
        else:
            plan = core.plan()
            # the planned load is the sum over running requests of prompt + emitted
            for g, ids in enumerate(plan.running):
                assert plan.loads[g] == sum(prompts[r] + emitted[r] for r in ids)
                assert len(ids) <= 2
            for ev in core.apply(plan):
                assert ev.position == emitted[ev.request_id]
                emitted[ev.request_id] += 1
                if ev.finished:
                    del prompts[ev.request_id]
    assert sum(c.tokens for c in core.counters) == sum(emitted.values())


def test_ledger_releases_each_hold_exactly_once() -> None:
    now = [0.0]
    led = KVLedger(ttl_s=10, clock=lambda: now[0])
    led.issue("k1", {"remote_block_ids": [1, 2]}, prompt_tokens=5)
    led.issue("k2", {"x": 1}, prompt_tokens=3)
    led.issue("k3", {"x": 1}, prompt_tokens=3)
    with pytest.raises(KVRefused) as e:
        led.pull("k1", {"remote_block_ids": [1, 3]})
    assert e.value.reason == "mismatch" and led.holds("k1")
    assert led.pull("k1", {"remote_block_ids": [1, 2]}).prompt_tokens == 5
    with pytest.raises(KVRefused, match="already released") as e:
        led.pull("k1", {"remote_block_ids": [1, 2]})
    assert e.value.reason == "released"
    with pytest.raises(KVRefused, match="never issued"):
        led.pull("nope", {})
    assert led.abort("k2") and not led.abort("k2")
    now[0] = 9.9
    assert led.expire() == []
    now[0] = 10.0
    assert led.expire() == ["k3"]
    assert led.history == {"k1": "pulled", "k2": "aborted", "k3": "expired"}
    assert led.snapshot()["released"] == {"pulled": 1, "aborted": 1, "expired": 1}
    with pytest.raises(ValueError, match="already issued"):
        led.issue("k1", {}, 1)


def test_config_errors_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--step-b-s: need 1 or 4 values"):
        EmulatorConfig("vllm", "decode", 4, 8000, step_b_s=(0.1, 0.2))
    with pytest.raises(ValueError, match="--port-per-rank"):
        EmulatorConfig("sglang", "decode", 2, 8000, port_per_rank=True)
    with pytest.raises(ValueError, match="--bootstrap-port"):
        EmulatorConfig("vllm", "prefill", 1, 8000, bootstrap_port=8998)
    with pytest.raises(ValueError, match="--kv-ttl-s"):
        EmulatorConfig("vllm", "prefill", 1, 8000, kv_ttl_s=0)
    cfg = EmulatorConfig("sglang", "decode", 2, 8000, step_a_s_per_token=(1e-6, 2e-6))
    assert cfg.step_b_s == (0.03, 0.03) and cfg.ttl_s == 300 and cfg.wait_s == 300
    assert cfg.step_model.step_s([10, 0]) == pytest.approx(0.03001)
