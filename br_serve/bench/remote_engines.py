"""Remote PD engines for ``bench-serve --engine vllm|sglang``: emulators in subprocesses.

:func:`emulated_engines` starts one prefill and one decode ``br-serve emulate-engine``
(protocol ``vllm`` or ``sglang``, ``dp_size = G``, the graph's step model per rank:
``a_g``, ``b_g`` of :meth:`GraphConfig.emulated_step_model`, so ``--slow`` slows the
emulator's ranks) as separate processes, waits for their ``/health`` and yields the
graph configuration that routes them (``decode_urls`` one URL + ``dp_size``: ranks
pinned per request). The processes are stopped on exit. :func:`engine_counters` reads
the decode emulator's step count and CPU time, the reference for the proxy overhead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from br_serve.serve.config import GraphConfig, parse_graph_config

#: the served model name the emulators answer to
REMOTE_MODEL = "emulated"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _floats(xs: tuple[float, ...]) -> str:
    return ",".join(repr(float(x)) for x in xs)


def emulator_commands(cfg: GraphConfig, protocol: str, prefill_port: int,
                      decode_port: int) -> list[list[str]]:
    """The two ``emulate-engine`` command lines (prefill, decode) for ``cfg``.

    Raises:
        ValueError: a step model the emulator cannot run (a per-request term ``c``).
    """
    a, b, c = cfg.emulated_step_model(scaled=True).arrays(cfg.replicas)
    if any(x != 0 for x in c):
        raise ValueError("step.c_s_per_request: the engine emulator models a * load + b "
                         "only; set it to 0 with --engine vllm|sglang")
    scale = cfg.engine.slowdown
    base = [sys.executable, "-m", "br_serve.cli", "emulate-engine", "--protocol", protocol,
            "--model", REMOTE_MODEL, "--log-level", "error"]
    prefill = [*base, "--role", "prefill", "--port", str(prefill_port),
               "--prefill-p0-s", repr(cfg.prefill.p0_s * scale),
               "--prefill-p1-s-per-token", repr(cfg.prefill.p1_s_per_token * scale)]
    decode = [*base, "--role", "decode", "--port", str(decode_port),
              "--dp-size", str(cfg.replicas), "--slots", str(cfg.slots),
              "--step-a-s-per-token", _floats(tuple(a.tolist())),
              "--step-b-s", _floats(tuple(b.tolist()))]
    return [prefill, decode]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], wait_s: float) -> None:
    import httpx

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine emulator for {url} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"engine emulator for {url} not healthy after {wait_s:g} s")


@contextlib.contextmanager
def emulated_engines(cfg: GraphConfig, protocol: str,
                     wait_s: float = 60.0) -> Iterator[tuple[GraphConfig, str]]:
    """``(graph config routing the emulators, decode base URL)``; see the module."""
    with engine_processes(cfg, protocol, wait_s) as (purl, durl):
        remote = parse_graph_config(cfg, engine=protocol, remote_prefill_urls=purl,
                                    remote_decode_urls=durl, remote_dp_size=cfg.replicas,
                                    remote_model=REMOTE_MODEL)
        yield remote, durl


@contextlib.contextmanager
def engine_processes(cfg: GraphConfig, protocol: str, wait_s: float = 60.0,
                     extra_args: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """A fresh prefill and decode emulator of ``cfg``'s step model (subprocesses, healthy
    before it yields): ``(prefill base URL, decode base URL)``; both stopped on exit.
    ``extra_args`` go to both command lines."""
    pport, dport = _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        for cmd in emulator_commands(cfg, protocol, pport, dport):
            procs.append(subprocess.Popen([*cmd, *extra_args], env=env,
                                          stdout=subprocess.DEVNULL, start_new_session=True))
        purl, durl = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}"
        _wait_healthy(purl, procs[0], wait_s)
        _wait_healthy(durl, procs[1], wait_s)
        yield purl, durl
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def engine_steps(decode_url: str, since: int = 0) -> dict[str, Any]:
    """The decode emulator's step log from step ``since`` on (``GET /emulator/steps``)."""
    import httpx

    r = httpx.get(f"{decode_url}/emulator/steps", params={"since": since}, timeout=30)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def engine_counters(decode_url: str) -> dict[str, float]:
    """The decode emulator's ``steps``, step-loop CPU, process CPU and late seconds."""
    import httpx

    st: dict[str, Any] = httpx.get(f"{decode_url}/emulator/stats", timeout=10).json()
    return {"steps": float(st["steps"]),
            "step_cpu_s": float(st.get("step_cpu_s", 0.0)),
            "process_cpu_s": float(st.get("process_cpu_s", 0.0)),
            "overrun_s": float(st.get("overrun_s", 0.0))}
