"""Turning a command line's policy list and ``KEY=VALUE`` options into per-policy runs.

Shared by every command that compares several policies in one go (``br-serve sim``,
``br-serve capacity``, the benchmarks). Nothing here knows a policy by name: what a
policy accepts comes from its options class, what it needs from its ``needs``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from br_serve.core.options import ConfigError, option_docs
from br_serve.core.policy import policy_class

#: a variant's name: what a ``LABEL.KEY=VALUE`` option, a table row and a pairing use
_LABEL = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One policy of a comparison: its name, its (loose) options, its predictor and,
    for a named variant (``LABEL=POLICY``), its own name."""

    policy: str
    options: dict[str, Any] = field(default_factory=dict)
    predictor: str | None = None
    variant: str | None = None

    @property
    def label(self) -> str:
        """``variant`` or ``policy``, then ``+predictor`` if one is set: unique within a
        plan, so two runs of one policy with different options are told apart."""
        name = self.variant or self.policy
        return name if self.predictor is None else f"{name}+{self.predictor}"


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

    ``entries``: policy names; ``NAME:PREDICTOR`` pins that entry's predictor;
    ``LABEL=NAME`` (or ``LABEL=NAME:PREDICTOR``) is a named variant of policy ``NAME``,
    so that one policy can run with different options (``br0,br0-time=br0`` with
    ``br0-time.cost=time``). ``options``: ``KEY`` applies to every listed entry whose
    policy has ``KEY``; ``ENTRY.KEY`` to that entry only (a policy name for a plain
    entry, the label for a variant). Predictors expand only policies that need one.

    Raises:
        ConfigError: an unknown policy, a bad or repeated label, or an option that no
            listed policy has (a field is honoured or refused by name, never silently
            ignored).
    """
    names: list[tuple[str, str, str | None, str | None]] = []  # key, policy, pin, variant
    for entry in entries:
        label, eq, rest = entry.partition("=")
        if not eq:
            label, rest = "", entry
        name, _, pin = rest.strip().partition(":")
        policy_class(name)  # unknown -> ConfigError naming it
        label = label.strip()
        if eq and not _LABEL.fullmatch(label):
            raise ConfigError(f"{entry}: a variant's label is letters, digits, '_' and "
                              f"'-' (got {label!r})")
        key = label or name
        if any(key == k and (eq or v is not None) for k, _, _, v in names):
            raise ConfigError(f"{entry}: label {key!r} is listed twice")
        names.append((key, name, pin or None, label or None))
    per: dict[str, dict[str, Any]] = {key: {} for key, *_ in names}
    policy_of = {key: name for key, name, *_ in names}
    for key, value in options.items():
        pol, dot, tail = key.rpartition(".")
        scoped = bool(dot) and pol in per
        targets = [pol] if scoped else list(per)
        opt = tail if scoped else key
        took = [t for t in targets if opt in _option_names(policy_of[t])]
        if not took:
            raise ConfigError(f"{key}: no policy of {', '.join(per)} has this option")
        for t in took:
            per[t][opt] = value
    preds = list(predictors)
    runs = []
    for key, name, pinned, variant in names:
        needs = policy_class(name).needs.predictor
        chosen: list[str | None] = [pinned] if pinned else preds if needs else [None]
        for pred in chosen:
            runs.append(PolicyRun(name, dict(per[key]), pred, variant))
    return runs


def _option_names(policy: str) -> set[str]:
    return {name for name, *_ in option_docs(policy_class(policy).Options)}
