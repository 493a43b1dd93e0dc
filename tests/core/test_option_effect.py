"""Every option a registered policy accepts is honoured: the policy reads it.

The project's rule is "honoured or refused by name, never silently ignored". For each
registered policy this builds it with options that turn its opt-in stages on, drives
it over drawn states (deep and shallow pools, equal and unequal replicas, running
detail, a predictor that answers, a clock that advances, ageing that fires) and
records which options the policy read while it was built and while it scheduled. An
option never read is accepted and ignored: the test fails naming it. A policy must
also refuse an unknown option by name.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest

from br_serve.core import ClusterSnapshot, PoolRequest, PromptPool, RunningRequests
from br_serve.core.options import ConfigError, Options, as_dict
from br_serve.core.policy import PolicyContext, policy_class, policy_names
from br_serve.core.predictor import Prediction

#: options that turn a policy's opt-in stages on, so the options read inside them are
#: reachable (the stage's own switches are read on every tick anyway)
STAGES: dict[str, dict[str, Any]] = {
    "br0": {"cost": "time", "ttft_budget_s": 5.0, "hold_budget_ms": 50.0},
    "brh": {"ttft_budget_s": 5.0, "hold_budget_ms": 50.0, "trust_decode_share": 0.0},
    "smg_cache_aware": {"balance_abs_threshold": 0},  # in-flight spreads here are small
}


class _Predictor:
    """Answers: about half the running requests end inside the window."""

    name = "test"

    def predict(self, running: RunningRequests, horizon_steps: int) -> Prediction:
        n = len(running)
        p = np.linspace(0.0, 1.0, n) if n else np.zeros(0)
        return Prediction(p_fin=p, mu_rem=np.linspace(1.0, horizon_steps / 2, n))

    def observe(self, finished: object) -> None:
        return None


def _spy_class(cls: type[Options], seen: set[str]) -> type[Options]:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def getattribute(self: Any, name: str) -> Any:
        if name in names:
            seen.add(name)
        return object.__getattribute__(self, name)

    return type(f"Spy{cls.__name__}", (cls,), {"__slots__": (),
                                               "__getattribute__": getattribute})


def _state(rng: np.random.Generator, g: int, slots: int, pool_n: int, hetero: bool,
           now_s: float) -> tuple[ClusterSnapshot, PromptPool]:
    reps: list[int] = []
    prompts: list[int] = []
    decoded: list[int] = []
    running = np.zeros(g, dtype=np.int64)
    for r in range(g):
        n = int(rng.integers(0, slots + 1))
        running[r] = n
        reps += [r] * n
        prompts += rng.lognormal(6.0, 1.2, n).astype(np.int64).tolist()
        decoded += rng.integers(0, 3000, n).tolist()
    rr = RunningRequests.build(reps, prompts, decoded)
    load = np.bincount(rr.replica, weights=rr.prompt_tokens + rr.decoded_tokens,
                       minlength=g).astype(np.int64)
    a = rng.uniform(2e-7, 2e-6, g) if hetero else 5e-7
    cluster = ClusterSnapshot.build(load, running, slots, None, None, step_a_s_per_token=a,
                                    running=rr)
    pool = PromptPool(capacity=max(pool_n, 1))
    for i in range(pool_n):
        pool.add(PoolRequest(f"q{i}", int(rng.lognormal(7.0, 1.5)), arrival_s=0.0,
                             enqueued_s=float(rng.uniform(0, max(now_s - 1, 0)))))
    return cluster, pool


def _drive(name: str, options: Options, seed: int = 0) -> None:
    clock = itertools.count(0.0, 1e-4)
    ctx = PolicyContext(rng=np.random.default_rng(seed), predictor=_Predictor(),
                        clock=lambda: float(next(clock)))
    pol = policy_class(name)(options, ctx)
    policy_class(name).needs_for(options)
    rng = np.random.default_rng(seed)
    tick = 0
    for hetero in (False, True):
        for pool_n in (0, 2, 6, 40, 200):
            for k in range(6):
                now_s = 20.0 * tick
                cluster, pool = _state(rng, 4, 4 + k, pool_n, hetero, now_s)
                pol.schedule(cluster, pool, now_s, tick)
                tick += 1


@pytest.mark.parametrize("name", sorted(policy_names()))
def test_every_option_is_read(name: str) -> None:
    cls = policy_class(name).Options
    seen: set[str] = set()
    spy = _spy_class(cls, seen)
    opts = spy(**{**as_dict(cls()), **STAGES.get(name, {})})
    seen.clear()  # construction validates (reads) every field
    _drive(name, opts)
    unread = sorted({f.name for f in dataclasses.fields(cls)} - seen)  # type: ignore[arg-type]
    assert not unread, f"{name} accepts options it never reads: {unread}"


def test_the_check_can_fail() -> None:
    """An options class with a field the policy never reads is caught."""
    cls = policy_class("jsq").Options

    @dataclasses.dataclass(frozen=True, slots=True)
    class Extra(cls):  # type: ignore[misc, valid-type]
        ignored: int = 0

    seen: set[str] = set()
    opts = _spy_class(Extra, seen)()
    seen.clear()
    _drive("jsq", opts)
    assert "ignored" not in seen


@pytest.mark.parametrize("name", ["br0", "brh"])
def test_unknown_option_is_refused_by_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"^no_such_option: Extra inputs"):
        from br_serve.core.options import parse_options
        parse_options(policy_class(name).Options, {"no_such_option": 1})


@pytest.mark.parametrize("key,value", [("cost", "time"), ("idle_over_balanced", 0.1),
                                       ("straggler_prompt_quantile", 0.2),
                                       ("step_coefficients", "configured")])
def test_brh_refuses_br0_only_options(key: str, value: object) -> None:
    from br_serve.core.policy import parse_policy_options
    with pytest.raises(ConfigError, match=rf"^{key}: Extra inputs"):
        parse_policy_options("brh", {key: value})
