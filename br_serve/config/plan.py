"""Turning a command line's policy list and ``KEY=VALUE`` options into per-policy runs.

Shared by every command that compares several policies in one go (``br-serve sim``,
``br-serve capacity``, the benchmarks). Nothing here knows a policy by name: what a
policy accepts comes from its options class, what it needs from its ``needs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from br_serve.core.options import ConfigError, option_docs
from br_serve.core.policy import policy_class


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One policy of a comparison: its name, its (loose) options and its predictor."""

    policy: str
    options: dict[str, Any] = field(default_factory=dict)
    predictor: str | None = None

    @property
    def label(self) -> str:
        return self.policy if self.predictor is None else f"{self.policy}+{self.predictor}"


def parse_key_values(items: Iterable[str], flag: str = "--policy-option") -> dict[str, Any]:
    """``["r_max=4", "brh.gamma=0.9"]`` -> ``{"r_max": "4", "brh.gamma": "0.9"}``.

    Values stay strings: each policy's options class coerces them to its own types.

    Raises:
        ValueError: an item without ``=``, named with ``flag``.
    """
    out: dict[str, Any] = {}
    for text in items:
        key, sep, val = text.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag}: expected KEY=VALUE, got {text!r}")
        out[key.strip()] = val.strip()
    return out


def plan_policy_runs(entries: Iterable[str], options: Mapping[str, Any],
                     predictors: Iterable[str | None] = (None,)) -> list[PolicyRun]:
    """One :class:`PolicyRun` per policy entry (and per predictor where one is needed).

    ``entries``: policy names; ``NAME:PREDICTOR`` pins that entry's predictor.
    ``options``: ``KEY`` applies to every listed policy whose options have ``KEY``;
    ``POLICY.KEY`` to that policy only. Predictors expand only policies that need one.

    Raises:
        ConfigError: an unknown policy, or an option that no listed policy has (a field
            is honoured or refused by name, never silently ignored).
    """
    names: list[tuple[str, str | None]] = []
    for entry in entries:
        name, _, pin = entry.partition(":")
        policy_class(name)  # unknown -> ConfigError naming it
        names.append((name, pin or None))
    per: dict[str, dict[str, Any]] = {name: {} for name, _ in names}
    for key, value in options.items():
        pol, dot, tail = key.rpartition(".")
        scoped = bool(dot) and pol in per
        targets = [pol] if scoped else list(per)
        opt = tail if scoped else key
        took = [t for t in targets if opt in _option_names(t)]
        if not took:
            raise ConfigError(f"{key}: no policy of {', '.join(per)} has this option")
        for t in took:
            per[t][opt] = value
    preds = list(predictors)
    runs = []
    for name, pinned in names:
        needs = policy_class(name).needs.predictor
        chosen: list[str | None] = [pinned] if pinned else preds if needs else [None]
        for pred in chosen:
            runs.append(PolicyRun(name, dict(per[name]), pred))
    return runs


def _option_names(policy: str) -> set[str]:
    return {name for name, *_ in option_docs(policy_class(policy).Options)}
