"""Research: CPU isolation of the emulated engine from the router (issue 28).

On a small shared host the emulated engine (``br-serve emulate-engine``, prefill and
decode servers) and the router under test (a real router's process, or Ray with the
graph's actors) compete for the same cores; a real deployment runs the engine on its own
accelerators. ``research/gap_bench.py --engine-cpus 1 --router-cpus 0`` separates them:

- the router side: the bench process itself (the client, the Ray driver) and every
  process below it (Ray's GCS and raylet, the workers the raylet forks: Serve's
  controller and proxy, the graph's actors; a real router's process) gets the router
  CPUs, every thread of each (``sched_setaffinity`` of one id moves one thread only);
  processes forked later inherit it from their parent's thread;
- the engine side: the emulator command lines are prefixed with ``taskset -c LIST``
  (the one function that builds them, ``remote_engines.emulator_commands``, is wrapped
  for the duration of an arm; the product code is unchanged).

:class:`AffinitySampler` reads ``Cpus_allowed_list`` of every thread of every process of
the tree while an arm runs and records, per role (emulator prefill / decode, raylet,
gcs_server, each Ray actor class, the router, the bench), the distinct values seen, so
the result file shows that the pinning took.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from br_serve.bench import remote_engines


def parse_cpus(text: str) -> frozenset[int]:
    """``"0"``, ``"0,1"``, ``"0-3"`` -> the CPU ids; an id this process may not use is
    refused by name."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ValueError(f"cpu list {text!r}: need a non-empty subset of {sorted(allowed)}")
    return frozenset(cpus)


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from ``/proc/*/stat``'s parent ids)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (d / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def role(cmd: list[str]) -> str:
    """A short name for the process of command line ``cmd``."""
    if not cmd:  # an exiting (zombie) process: its pid tells which it was
        return "?"
    if "emulate-engine" in cmd and "--role" in cmd:
        return "emulator:" + cmd[cmd.index("--role") + 1]
    a0 = cmd[0]
    if a0.startswith("ray::"):  # a Ray worker's title: ray::Class[.method()] or ServeReplica
        return a0.split(" ")[0].split(".")[0].split("(")[0][:60]
    base = os.path.basename(a0.split(" ")[0])
    if base in ("raylet", "gcs_server"):
        return base
    if "-m" in cmd[:-1]:
        mod = cmd[cmd.index("-m") + 1]
        if mod in ("smg", "sglang_router.launch_router", "vllm_router.launch_router") or \
                "router" in mod:
            return "router:" + mod
        return "python -m " + mod
    for a in cmd[1:3]:  # python SCRIPT: Ray's helpers (log monitor, agents)
        if a.endswith(".py"):
            return "python " + os.path.basename(a)
    return base


def set_tree_affinity(cpus: frozenset[int], root: int | None = None,
                      skip: Callable[[list[str]], bool] | None = None) -> int:
    """Every thread of ``root`` (default: this process) and of its descendants, except
    processes whose command line ``skip`` accepts, to ``cpus``; the number of threads
    set."""
    n = 0
    for pid in descendants(root or os.getpid()):
        with contextlib.suppress(OSError):
            if skip is not None and skip(_cmdline(pid)):
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpus)
                    n += 1
    return n


def _is_emulator(cmd: list[str]) -> bool:
    return "emulate-engine" in cmd


def pin_router_side(cpus: frozenset[int]) -> int:
    """This process's tree (not the emulators) to ``cpus``."""
    return set_tree_affinity(cpus, skip=_is_emulator)


@contextlib.contextmanager
def engine_cpus(cpus: frozenset[int] | None) -> Iterator[None]:
    """While open, emulators that ``remote_engines.engine_processes`` starts run under
    ``taskset -c cpus`` (``None``: as they are)."""
    if cpus is None:
        yield
        return
    orig = remote_engines.emulator_commands
    prefix = ["taskset", "-c", ",".join(str(c) for c in sorted(cpus))]

    def pinned(*a: Any, **k: Any) -> list[list[str]]:
        return [[*prefix, *cmd] for cmd in orig(*a, **k)]

    remote_engines.emulator_commands = pinned
    try:
        yield
    finally:
        remote_engines.emulator_commands = orig


def snapshot(root: int | None = None) -> dict[str, dict[str, Any]]:
    """Per role: processes, threads, the distinct ``Cpus_allowed_list`` values of their
    threads, one pid."""
    out: dict[str, dict[str, Any]] = {}
    for pid in descendants(root or os.getpid()):
        with contextlib.suppress(OSError):
            r = role(_cmdline(pid))
            vals = set()
            tids = os.listdir(f"/proc/{pid}/task")
            for tid in tids:
                with contextlib.suppress(OSError):
                    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                        if line.startswith("Cpus_allowed_list:"):
                            vals.add(line.split(":", 1)[1].strip())
            e = out.setdefault(r, {"pids": set(), "threads": 0, "cpus_allowed": set(),
                                   "sample_pid": pid})
            e["pids"].add(pid)
            e["threads"] += len(tids)
            e["cpus_allowed"] |= vals
    return out


class AffinitySampler:
    """Snapshots the tree every ``every_s`` on a thread while open; :meth:`result` merges
    them (per role: distinct processes, max threads in one snapshot, every
    ``Cpus_allowed_list`` value seen)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._seen: dict[str, dict[str, Any]] = {}
        self._n = 0
        self._th = threading.Thread(target=self._run, daemon=True)

    def _take(self) -> None:
        for r, e in snapshot().items():
            m = self._seen.setdefault(r, {"pids": set(), "max_threads": 0,
                                          "cpus_allowed": set(), "sample_pid": e["sample_pid"]})
            m["pids"] |= e["pids"]
            m["max_threads"] = max(m["max_threads"], e["threads"])
            m["cpus_allowed"] |= e["cpus_allowed"]
        self._n += 1

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def __enter__(self) -> AffinitySampler:
        self._take()
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()

    def result(self) -> dict[str, Any]:
        return {"snapshots": self._n, "roles": {
            r: {"processes": len(m["pids"]), "max_threads": m["max_threads"],
                "cpus_allowed": sorted(m["cpus_allowed"]), "sample_pid": m["sample_pid"]}
            for r, m in sorted(self._seen.items())}}
