"""``MooncakeMaster.start`` when the binary cannot run: the message names the missing
shared library and its Debian package (fake binaries; no Mooncake needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from br_serve.transport import mooncake_master as mm

LOADER_LINE = ("mooncake_master: error while loading shared libraries: libibverbs.so.1: "
               "cannot open shared object file: No such file or directory")


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "mooncake_master"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return str(p)


def _start_error(monkeypatch: pytest.MonkeyPatch, binary: str) -> str:
    monkeypatch.setattr(mm, "find_master_binary", lambda: binary)
    with pytest.raises(RuntimeError) as info:
        mm.MooncakeMaster(ready_timeout_s=10).start()
    return str(info.value)


def test_missing_libibverbs_names_library_and_package(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _start_error(monkeypatch, _script(tmp_path, f"echo '{LOADER_LINE}' >&2; exit 127"))
    assert "libibverbs.so.1" in msg and "apt-get install libibverbs1" in msg
    assert "exited with 127:" not in msg


def test_other_early_exits_keep_the_log_tail(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _start_error(monkeypatch, _script(tmp_path, "echo 'bad flag --x' >&2; exit 3"))
    assert msg.startswith("mooncake_master exited with 3:") and "bad flag --x" in msg
    msg = _start_error(monkeypatch, _script(tmp_path, "exit 127"))
    assert "a command or shared library was not found" in msg and "ldd" in msg


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a real ELF")
def test_real_loader_failure_and_ldd_fallback(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lib.c").write_text("int br_fake(void) { return 0; }\n")
    (tmp_path / "main.c").write_text("int br_fake(void);\nint main(void) { return br_fake(); }\n")
    lib = tmp_path / "libbrmissing.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), "-Wl,-soname,libbrmissing.so.1",
                    str(tmp_path / "lib.c")], check=True)
    elf = tmp_path / "needs_lib"
    subprocess.run(["gcc", "-o", str(elf), str(tmp_path / "main.c"), f"-L{tmp_path}",
                    "-l:libbrmissing.so.1"], check=True)
    lib.unlink()  # now the loader cannot find it: exit 127, its message on stderr
    msg = _start_error(monkeypatch, str(elf))
    assert "shared library libbrmissing.so.1 not found" in msg
    assert "apt-file search libbrmissing.so.1" in msg
    assert mm.missing_libraries("", str(elf)) == ["libbrmissing.so.1"]  # from ldd
