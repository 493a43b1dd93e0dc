"""Research: where an arm's CPU goes, per process role (issue 28).

:class:`CpuSampler` reads ``utime + stime`` of every process of this process's tree
(``/proc/PID/stat``) every ``every_s`` while open. :meth:`CpuSampler.result` gives, per
role (:func:`research.pinning.role` of the process's latest title: emulator prefill /
decode, raylet, gcs_server, each Ray actor class, Serve's proxy, the real router, the
bench itself), the CPU seconds used between the first and the last sample inside a
wall window (``mark``: the replay's start and end), and the cores that makes over the
sampled span. A process that starts or ends inside the window loses at most ``every_s``
of its time: the figures are lower bounds within that.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

try:
    from research import pinning
except ModuleNotFoundError:  # run as a script from research/
    import pinning  # type: ignore[no-redef]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
#: titles a Ray worker has before it becomes an actor (its later title names it)
_GENERIC = ("ray::IDLE", "python default_worker.py", "?")


def _cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) * _TICK_S  # utime, stime (fields 14, 15)


class CpuSampler:
    """Per-role CPU of this process's tree while open (see the module docstring)."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._samples: list[tuple[float, dict[int, float]]] = []
        self._role: dict[int, str] = {}
        self.window: tuple[float, float] | None = None
        self._th = threading.Thread(target=self._run, daemon=True)

    def mark(self, start_s: float, end_s: float) -> None:
        """The wall window (``time.monotonic``) to count."""
        self.window = (start_s, end_s)

    def _take(self) -> None:
        cpu: dict[int, float] = {}
        for pid in pinning.descendants(os.getpid()):
            with contextlib.suppress(OSError, ValueError, IndexError):
                cpu[pid] = _cpu_s(pid)
                r = pinning.role(pinning._cmdline(pid))
                if r not in _GENERIC or pid not in self._role:
                    self._role[pid] = r
        self._samples.append((time.monotonic(), cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def __enter__(self) -> CpuSampler:
        self._take()
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()
        self._take()

    def result(self) -> dict[str, Any]:
        lo, hi = self.window or (float("-inf"), float("inf"))
        inside = [s for s in self._samples if lo <= s[0] <= hi]
        if len(inside) < 2:
            return {"samples": len(inside), "roles": {}}
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        for _, cpu in inside:
            for pid, v in cpu.items():
                first.setdefault(pid, v)
                last[pid] = v
        span = inside[-1][0] - inside[0][0]
        roles: dict[str, dict[str, float]] = {}
        for pid, v in last.items():
            e = roles.setdefault(self._role.get(pid, "?"), {"cpu_s": 0.0, "processes": 0})
            e["cpu_s"] += v - first[pid]
            e["processes"] += 1
        total = sum(e["cpu_s"] for e in roles.values())
        return {"samples": len(inside), "every_s": self.every_s, "span_s": round(span, 2),
                "total_cpu_s": round(total, 2), "cores": round(total / span, 3),
                "roles": {r: {"cpu_s": round(e["cpu_s"], 2), "cores": round(e["cpu_s"] / span, 3),
                              "processes": e["processes"]}
                          for r, e in sorted(roles.items(), key=lambda kv: -kv[1]["cpu_s"])}}
