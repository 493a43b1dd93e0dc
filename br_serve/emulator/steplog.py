"""What the barrier did, step by step: the emulator's record of every lock-step decode step.

A pure object (no asyncio, no clock: the driver passes the times). The step driver
records each applied step: when it ended (Unix seconds, so a client on the same host can
line its own events up with it), its modelled duration, how late the loop ran it, and per
rank the load (prompt + decoded tokens of the running requests), the running and the
waiting request counts. A benchmark reads it from ``GET /emulator/steps`` (rows) and
``GET /emulator/barrier`` (the summary below) and so measures imbalance at the engine,
whoever routed the requests.

Summary (over every recorded step; a step with nothing running is not a step):

- ``mean_max_load_tokens``, ``mean_mean_load_tokens``: means over steps of ``max_g L_g``
  and ``mean_g L_g``;
- ``mean_imbalance_tokens``: mean over steps of ``G * max_g L_g - sum_g L_g``, the idle
  work burned at the barrier (DESIGN.md section 2);
- ``barrier_idle_share``: ``sum_steps sum_g (tau - cost_g) / sum_steps G * tau`` with
  ``cost_g = a_g L_g + b_g`` the rank's own step cost and ``tau`` the step (their max);
- ``busy_s``, ``tokens``, ``tokens_per_busy_s``: modelled step time summed, tokens
  emitted, and their ratio (the engine's decode throughput while it had work);
- ``mean_running``: per rank, mean running requests over steps.

``gen_throughput(g)`` is the rank's tokens per second over its last ``window`` steps, the
figure SGLang's ``/v1/loads`` reports as ``gen_throughput`` (SGLang measures it over its
decode log interval, 40 steps by default).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

#: the columns of one row of ``rows()``
COLUMNS = ("step", "t_end_unix_s", "duration_s", "late_s", "loads", "running", "waiting")


class StepLog:
    """Bounded log of steps (the oldest rows drop past ``max_rows``) plus running sums
    over every step ever recorded (never dropped)."""

    def __init__(self, a_s_per_token: Sequence[float], b_s: Sequence[float],
                 max_rows: int = 500_000, window: int = 40) -> None:
        if len(a_s_per_token) != len(b_s) or not b_s:
            raise ValueError("step log: a and b need one value per rank")
        if max_rows < 1 or window < 1:
            raise ValueError("step log: max_rows and window must be >= 1")
        self.a = tuple(float(x) for x in a_s_per_token)
        self.b = tuple(float(x) for x in b_s)
        self.dp_size = len(self.b)
        self._rows: deque[tuple[Any, ...]] = deque(maxlen=max_rows)
        self._recent: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=window)
        self.steps = 0
        self.busy_s = 0.0
        self.late_s = 0.0
        self.tokens = 0
        self._sum_max = 0.0
        self._sum_mean = 0.0
        self._sum_idle_s = 0.0
        self._sum_running = [0] * self.dp_size

    def record(self, t_end_unix_s: float, duration_s: float, late_s: float,
               loads: Sequence[int], running: Sequence[int], waiting: Sequence[int]) -> None:
        """One applied step; ``running[g]`` requests of rank g each emitted one token."""
        g = self.dp_size
        if not len(loads) == len(running) == len(waiting) == g:
            raise ValueError(f"step log: need {g} values per rank")
        self._rows.append((self.steps, t_end_unix_s, duration_s, late_s, tuple(loads),
                           tuple(running), tuple(waiting)))
        self.steps += 1
        self.busy_s += duration_s
        self.late_s += late_s
        n = sum(running)
        self.tokens += n
        top = max(loads)
        self._sum_max += top
        self._sum_mean += sum(loads) / g
        if duration_s > 0:
            self._sum_idle_s += sum(duration_s - (a * ld + b)
                                    for a, b, ld in zip(self.a, self.b, loads, strict=True))
        for r in range(g):
            self._sum_running[r] += running[r]
        self._recent.append((duration_s + late_s, tuple(running)))

    def gen_throughput(self, rank: int) -> float:
        """Tokens per second of ``rank`` over the last ``window`` steps (0 when idle)."""
        span = sum(d for d, _ in self._recent)
        if span <= 0:
            return 0.0
        return sum(r[rank] for _, r in self._recent) / span

    def rows(self, since: int = 0, limit: int | None = None) -> list[list[Any]]:
        """Rows with ``step >= since`` (oldest first, at most ``limit``)."""
        out: list[list[Any]] = []
        first = self._rows[0][0] if self._rows else 0
        skip = max(0, since - first)
        for i, row in enumerate(self._rows):
            if i < skip:
                continue
            if limit is not None and len(out) >= limit:
                break
            out.append([row[0], row[1], row[2], row[3], list(row[4]), list(row[5]),
                        list(row[6])])
        return out

    def summary(self) -> dict[str, Any]:
        n, g = self.steps, self.dp_size
        mean = (lambda x: x / n) if n else (lambda x: None)
        return {
            "dp_size": g, "steps": n, "busy_s": self.busy_s, "late_s": self.late_s,
            "tokens": self.tokens,
            "tokens_per_busy_s": self.tokens / self.busy_s if self.busy_s > 0 else None,
            "mean_step_ms": 1e3 * self.busy_s / n if n else None,
            "mean_max_load_tokens": mean(self._sum_max),
            "mean_mean_load_tokens": mean(self._sum_mean),
            "mean_imbalance_tokens": mean(g * self._sum_max - g * self._sum_mean),
            "barrier_idle_share": (self._sum_idle_s / (g * self.busy_s)
                                   if self.busy_s > 0 else None),
            "mean_running": [mean(float(x)) for x in self._sum_running],
            "step_model": {"a_s_per_token": list(self.a), "b_s": list(self.b)},
        }


def summarise_rows(rows: Sequence[Sequence[Any]], a_s_per_token: Sequence[float],
                   b_s: Sequence[float]) -> dict[str, Any]:
    """:meth:`StepLog.summary` of ``rows`` only (rows of ``GET /emulator/steps``, e.g. the
    steps of one replay), computed the same way."""
    log = StepLog(a_s_per_token, b_s, max_rows=1)
    for row in rows:
        log.record(row[1], row[2], row[3], row[4], row[5], row[6])
    out = log.summary()
    g = log.dp_size
    loads = [max(r[4]) for r in rows]
    out["max_load_tokens_p95"] = (sorted(loads)[int(0.95 * (len(loads) - 1))]
                                  if loads else None)
    out["mean_waiting"] = ([sum(r[6][k] for r in rows) / len(rows) for k in range(g)]
                           if rows else None)
    return out
