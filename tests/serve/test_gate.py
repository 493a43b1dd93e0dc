"""AdmissionGate: refuses before prefill when the graph is full (pure, injected clock)."""

from __future__ import annotations

from br_serve.serve.frontend.gate import AdmissionGate


def _gate() -> tuple[AdmissionGate, list[float]]:
    now = [0.0]
    return AdmissionGate(replicas=1, slots=2, pool_capacity=1, clock=lambda: now[0]), now


def test_refuses_beyond_capacity_with_a_retry_after() -> None:
    gate, now = _gate()
    assert [gate.enter() for _ in range(3)] == [None, None, None]
    assert gate.enter() == 1  # full; no completion seen yet: retry in a second
    for _ in range(2):
        now[0] += 1.0
        gate.leave()
    assert gate.enter() is None and gate.enter() is None
    assert gate.enter() == 5  # one over, 2 completions in 10 s: 5 s


def test_a_request_given_up_holds_its_place_for_two_observations() -> None:
    gate, _ = _gate()
    for _ in range(3):
        gate.enter()
    gate.leave(released=False)  # the client went away: its abort has not landed yet
    assert gate.inside == 2 and gate.enter() is not None  # still counted
    # the scheduler's count may have been taken before the abort landed
    gate.observe(alive_replicas=1, scheduler_requests=2)
    assert gate.load() == 3 and gate.enter() is not None
    gate.observe(alive_replicas=1, scheduler_requests=2)  # surely after it
    assert gate.load() == 2 and gate.enter() is None
    gate.leave()  # a finished request frees its place at once
    assert gate.elsewhere == 2 and gate.load() == 2 and gate.enter() is None


def test_capacity_follows_the_alive_replicas() -> None:
    gate, _ = _gate()
    gate.observe(alive_replicas=0, scheduler_requests=0)
    assert gate.capacity() == 1
    assert gate.enter() is None and gate.enter() is not None
