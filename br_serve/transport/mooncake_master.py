"""Start and stop a local ``mooncake_master`` (tests, benchmarks, single-host demos).

Contracts: :meth:`MooncakeMaster.start` returns only once the master accepts TCP
connections on its RPC port, or raises ``RuntimeError`` within ``ready_timeout_s``
(binary missing, early exit with its log tail, or no readiness). :meth:`stop` ends
the process it started (terminate, then kill after a grace period) and nothing else.
Ports default to free ones picked by the OS.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def find_master_binary() -> str:
    """Path of ``mooncake_master`` (on PATH or next to this Python).

    Raises:
        FileNotFoundError: not installed (names the package to install).
    """
    for cand in (shutil.which("mooncake_master"), str(Path(sys.executable).parent /
                                                      "mooncake_master")):
        if cand and Path(cand).is_file():
            return cand
    raise FileNotFoundError("mooncake_master not found: pip install "
                            "mooncake-transfer-engine-non-cuda (or the -npu wheel)")


class MooncakeMaster:
    """A ``mooncake_master`` subprocess; use as a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, metrics_port: int = 0,
                 ready_timeout_s: float = 20.0, extra_args: tuple[str, ...] = ()) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = extra_args
        self._proc: subprocess.Popen[bytes] | None = None
        # closed in stop(): the file must outlive this call for the subprocess
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="mooncake_master_", suffix=".log", delete=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = Path(self._log.name).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def start(self) -> MooncakeMaster:
        cmd = [find_master_binary(), f"--rpc_port={self.port}",
               f"--metrics_port={self.metrics_port}", *self.extra_args]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                msg = (f"mooncake_master exited with {self._proc.returncode}:\n"
                       f"{self.log_tail()}")
                self.stop()
                raise RuntimeError(msg)
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        msg = (f"mooncake_master not ready on {self.address} within "
               f"{self.ready_timeout_s} s:\n{self.log_tail()}")
        self.stop()
        raise RuntimeError(msg)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
