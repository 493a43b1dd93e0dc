"""Real vLLM servers (CPU build, .venv-vllm) for the tests: venv, tiny model, processes.

Every server is a process group started with ``setsid``; readiness is bounded (the
process must answer ``GET /v1/models`` within ``ready_s`` or the start fails with the tail
of its log); :meth:`VllmServer.stop` sends SIGINT, then SIGKILL, to the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from br_serve.remote.loads import parse_prometheus
from tests.realvllm.tinymodel import POSITIONS

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
SERVED_MODEL = "tiny"
#: the tiny model's positions: room for streams long enough to leave mid-way
MAX_MODEL_LEN = POSITIONS
#: vLLM's CPU backend on a small shared machine: 1 GiB of KV, no core pinning, no AMX
#: (the float32 path never asks for it, but oneDNN would pick AMX kernels otherwise)
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
       "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "VLLM_LOGGING_LEVEL": "INFO",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
       # the API server waits this long for its engine cores (vLLM's default 600 s)
       "VLLM_ENGINE_READY_TIMEOUT_S": "1200"}


def ensure_venv(timeout_s: float = 1200.0) -> str | None:
    """Run ``.ci/setup-vllm`` unless its stamp says this venv was built by the current
    script (a server start then shows any breakage, with its log); the reason on failure."""
    import hashlib

    script = ROOT / ".ci" / "setup-vllm"
    stamp = VENV / ".br-setup-stamp"
    if stamp.is_file() and PYTHON.is_file() and stamp.read_text().strip() == (
            hashlib.sha256(script.read_bytes()).hexdigest()):
        return None
    try:
        r = subprocess.run(["bash", str(ROOT / ".ci" / "setup-vllm")], capture_output=True,
                           text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f".ci/setup-vllm did not finish within {timeout_s:.0f} s"
    if r.returncode != 0:
        return f".ci/setup-vllm failed: {(r.stderr or r.stdout).strip()[-400:]}"
    return None


def build_tiny_model(out: Path) -> Path:
    subprocess.run([str(PYTHON), str(Path(__file__).with_name("tinymodel.py")), str(out)],
                   check=True, capture_output=True, timeout=300,
                   env={**os.environ, **ENV})
    return out


@dataclass
class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process."""

    name: str
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for s in parse_prometheus(self.metrics()):
            if s.name == name and all(s.label(k) == v for k, v in labels.items()):
                total += s.value
        return total

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a server that dies mid-run)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def start(name: str, model: Path, port: int, log_dir: Path, extra: Sequence[str] = (),
          dp_size: int = 1) -> VllmServer:
    """Start a server; :func:`wait_ready` before use.

    ``--enforce-eager``: no torch.compile warm-up (minutes of inductor work on 2 busy
    cores, for a model this small nothing to gain). With one DP rank the engine core runs
    its worker in-process (``uni`` executor, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): one
    process less to import torch and vLLM (the API server still runs the engine core in its
    own process, so a client abort goes the same way as in a default server).
    ``--enable-log-requests``: the server logs each abort ("Aborted request(s) ..."), the
    only trace of one (vLLM 0.32 counts no client abort in its metrics).
    """
    log_path = log_dir / f"vllm-{name}.log"
    args = [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", SERVED_MODEL, "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--block-size", "32",
            "--max-num-seqs", "8", "--enforce-eager", "--enable-log-requests",
            "--host", "127.0.0.1",
            "--port", str(port), *extra]
    env = {**os.environ, **ENV}
    if dp_size == 1:
        args += ["--distributed-executor-backend", "uni"]
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    else:
        args += ["--data-parallel-size", str(dp_size)]
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen(["setsid", "env", "--default-signal=INT", *args],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=log_dir, env=env)
    return VllmServer(name, port, log_path, proc)


def wait_log(server: VllmServer, marker: str, limit_s: float) -> None:
    """Wait until ``marker`` shows in the server's log; raise with the log's tail if the
    server exits or ``limit_s`` passes first."""
    deadline = time.monotonic() + limit_s
    while marker not in server.log():
        if server.proc.poll() is not None or time.monotonic() > deadline:
            why = (f"exited with {server.proc.returncode}" if server.proc.poll() is not None
                   else f"did not log {marker!r} within {limit_s:.0f} s")
            server.stop()
            raise RuntimeError(f"vLLM server {server.name} {why}; log tail:\n"
                               f"{server.log()[-3000:]}")
        time.sleep(1.0)


def wait_ready(servers: Sequence[VllmServer], ready_s: float) -> None:
    """Every server answers ``GET /v1/models`` within ``ready_s``, else stop them all and
    raise with the log tail of the first that is not ready."""
    deadline = time.monotonic() + ready_s
    pending = list(servers)
    while pending and time.monotonic() < deadline:
        for s in list(pending):
            if s.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{s.url}/v1/models", timeout=2).status_code == 200:
                    pending.remove(s)
            except httpx.HTTPError:
                pass
        else:
            time.sleep(1.0)
            continue
        break
    if pending:
        s = pending[0]
        why = (f"exited with {s.proc.returncode}" if s.proc.poll() is not None
               else f"not ready within {ready_s:.0f} s")
        for other in servers:
            other.stop()
        raise RuntimeError(f"vLLM server {s.name} {why}; log tail:\n{s.log()[-3000:]}")
