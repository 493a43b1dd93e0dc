"""Per-rank load from an engine: vLLM's Prometheus ``/metrics``, SGLang's ``/v1/loads``.

:func:`parse_prometheus` reads the Prometheus text exposition format (0.0.4): ``# HELP``
/ ``# TYPE`` / other comments skipped, ``name{label="value",...} value [timestamp]``
samples with escaped label values (``\\\\``, ``\\"``, ``\\n``) and ``NaN`` / ``+Inf``
values. :func:`vllm_rank_loads` groups vLLM's gauges by their ``engine`` label (the DP
rank); :func:`sglang_rank_loads` reads the ``loads`` list of ``/v1/loads``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One DP rank's load as the engine reports it (``None``: not reported)."""

    rank: int
    running: int
    waiting: int
    kv_usage: float | None = None
    used_tokens: int | None = None


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _labels(text: str, lineno: int) -> tuple[tuple[tuple[str, str], ...], str]:
    """Parse ``{a="x",b="y"}`` at the start of ``text``; returns labels and the rest."""
    assert text.startswith("{")
    i, n = 1, len(text)
    out: list[tuple[str, str]] = []
    while True:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return tuple(out), text[i + 1:]
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            raise ValueError(f"line {lineno}: malformed labels")
        key = text[i:eq].strip()
        i = eq + 2
        value: list[str] = []
        while True:
            if i >= n:
                raise ValueError(f"line {lineno}: unterminated label value")
            ch = text[i]
            if ch == "\\" and i + 1 < n:
                value.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                value.append(ch)
                i += 1
        out.append((key, "".join(value)))


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition.

    Raises:
        ValueError: a malformed sample line (the message names the line number).
    """
    samples: list[Sample] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, rest = _labels(line[brace:], lineno)
        else:
            if space < 0:
                raise ValueError(f"line {lineno}: sample without a value: {raw!r}")
            name, labels, rest = line[:space], (), line[space:]
        parts = rest.split()
        if not name or not parts or len(parts) > 2:
            raise ValueError(f"line {lineno}: malformed sample: {raw!r}")
        try:
            value = float(parts[0])  # float() reads NaN, +Inf, -Inf
        except ValueError:
            raise ValueError(f"line {lineno}: bad value {parts[0]!r}") from None
        samples.append(Sample(name, labels, value))
    return samples


_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, deprecated


def vllm_rank_loads(metrics: str | Iterable[Sample],
                    model_name: str | None = None) -> dict[int, RankLoad]:
    """Per-rank load from a vLLM ``/metrics`` page (or its parsed samples).

    A rank is a value of the ``engine`` label (a sample without it is rank 0, as an
    engine without data parallelism reports). ``model_name``: keep only that model's
    samples. A rank appears when it reports ``vllm:num_requests_running``.
    """
    samples = parse_prometheus(metrics) if isinstance(metrics, str) else list(metrics)
    running: dict[int, float] = {}
    waiting: dict[int, float] = {}
    kv: dict[str, dict[int, float]] = {name: {} for name in _KV}
    for s in samples:
        if model_name is not None and s.label("model_name") not in (None, model_name):
            continue
        target = (running if s.name == _RUNNING else waiting if s.name == _WAITING
                  else kv.get(s.name))
        if target is None:
            continue
        engine = s.label("engine")
        try:
            rank = int(engine) if engine is not None else 0
        except ValueError:
            continue
        target[rank] = target.get(rank, 0.0) + s.value
    out = {}
    for rank in sorted(running):
        use = kv[_KV[0]].get(rank, kv[_KV[1]].get(rank))
        out[rank] = RankLoad(rank, _count(running[rank]), _count(waiting.get(rank, 0.0)),
                             use if use is None or math.isfinite(use) else None)
    return out


def single_rank_load(metrics: str | Iterable[Sample], rank: int,
                     model_name: str | None = None) -> RankLoad:
    """The load of a server that runs exactly one rank (external DP), as ``rank``.

    Raises:
        ValueError: the page reports no rank or several.
    """
    loads = vllm_rank_loads(metrics, model_name)
    if len(loads) != 1:
        raise ValueError(f"expected one engine on a per-rank server, found {sorted(loads)}")
    (load,) = loads.values()
    return RankLoad(rank, load.running, load.waiting, load.kv_usage, load.used_tokens)


def sglang_rank_loads(body: Mapping[str, Any]) -> dict[int, RankLoad]:
    """Per-rank load from SGLang's ``GET /v1/loads`` JSON (``loads[*].dp_rank`` ...).

    Raises:
        ValueError: no ``loads`` list, or an entry without an integer ``dp_rank``.
    """
    rows = body.get("loads")
    if not isinstance(rows, list):
        raise ValueError("/v1/loads: no 'loads' list in the answer")
    out: dict[int, RankLoad] = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("dp_rank"), int):
            raise ValueError(f"/v1/loads: entry without an integer dp_rank: {row!r}")
        rank = row["dp_rank"]
        usage = row.get("token_usage")
        used = row.get("num_used_tokens")
        out[rank] = RankLoad(rank, int(row.get("num_running_reqs") or 0),
                             int(row.get("num_waiting_reqs") or 0),
                             float(usage) if isinstance(usage, int | float) else None,
                             int(used) if isinstance(used, int | float) else None)
    return out


def _count(v: float) -> int:
    return int(v) if math.isfinite(v) else 0
