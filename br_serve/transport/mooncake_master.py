"""Start and stop a local ``mooncake_master`` (tests, benchmarks, single-host demos).

Contracts: :meth:`MooncakeMaster.start` returns only once the master accepts TCP
connections on its RPC port, or raises ``RuntimeError`` within ``ready_timeout_s``
(binary missing, early exit with its log tail, or no readiness). An early exit for a
missing shared library (the dynamic loader's exit 127) names the library and the
Debian/Ubuntu package that provides it (Mooncake's CPU wheel needs ``libibverbs1``).
:meth:`stop` ends the process it started (terminate, then kill after a grace period)
and nothing else.
Ports default to free ones picked by the OS.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Shared libraries Mooncake's wheels load from the system -> the Debian/Ubuntu package.
DEBIAN_PACKAGES = {
    "libibverbs.so.1": "libibverbs1",
    "librdmacm.so.1": "librdmacm1",
    "libnuma.so.1": "libnuma1",
    "libcurl.so.4": "libcurl4",
    "libnl-3.so.200": "libnl-3-200",
    "libnl-route-3.so.200": "libnl-route-3-200",
}

_LOADER_MISSING = re.compile(r"error while loading shared libraries: (\S+?): cannot open")


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


def missing_libraries(log: str, binary: str | None = None) -> list[str]:
    """Shared libraries the dynamic loader could not find, from its message in ``log``;
    with an empty log, from ``ldd binary`` (the real ELF behind a Python wrapper)."""
    found = _LOADER_MISSING.findall(log)
    if found or binary is None:
        return list(dict.fromkeys(found))
    elf = _real_binary(binary)
    if elf is None or shutil.which("ldd") is None:
        return []
    try:
        out = subprocess.run(["ldd", elf], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln.split()[0] for ln in out.splitlines() if "=> not found" in ln]


def _real_binary(path: str) -> str | None:
    """``path`` if it is an ELF file, else the binary the ``mooncake`` package ships
    (``mooncake_master`` on PATH is a Python script that execs it)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) == b"\x7fELF":
                return path
    except OSError:
        return None
    spec = importlib.util.find_spec("mooncake")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        cand = Path(loc) / "mooncake_master"
        if cand.is_file():
            return str(cand)
    return None


def exit_message(returncode: int, log: str, binary: str | None = None) -> str:
    """Why ``mooncake_master`` exited at start, in one sentence plus its log tail."""
    libs = missing_libraries(log, binary) if returncode == 127 or "shared librar" in log \
        else []
    if libs:
        hints = [f"apt-get install {DEBIAN_PACKAGES[lib]}" if lib in DEBIAN_PACKAGES
                 else f"install the package that provides {lib} (apt-file search {lib})"
                 for lib in libs]
        return (f"mooncake_master cannot start: shared librar{'ies' if len(libs) > 1 else 'y'}"
                f" {', '.join(libs)} not found (Debian/Ubuntu: {'; '.join(hints)})")
    if returncode == 127:
        return (f"mooncake_master exited with 127 (a command or shared library was not "
                f"found); check `ldd {binary or 'mooncake_master'}`"
                + (f":\n{log}" if log else " (it printed nothing)"))
    return f"mooncake_master exited with {returncode}:\n{log or '(no output)'}"


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
        binary = find_master_binary()
        cmd = [binary, f"--rpc_port={self.port}",
               f"--metrics_port={self.metrics_port}", *self.extra_args]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                msg = exit_message(self._proc.returncode, self.log_tail(), binary)
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
