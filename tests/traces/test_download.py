"""The downloader, against a local file:// source (tests never touch the network)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from br_serve.traces import download as dl


def test_download_local_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "origin.csv"
    src.write_text("arrival_s,input_tokens,output_tokens\n0,1,2\n")
    fake = dl.Source("local", src.as_uri(), "trace.csv", "test")
    monkeypatch.setattr(dl, "SOURCES", (fake,))
    out = dl.download("local", tmp_path / "dest")
    assert out == tmp_path / "dest" / "local" / "trace.csv"
    assert out.read_text() == src.read_text()
    assert not list(out.parent.glob("*.part"))
    src.write_text("changed\n")
    assert dl.download("local", tmp_path / "dest").read_text() != "changed\n"  # kept
    assert dl.download("local", tmp_path / "dest", force=True).read_text() == "changed\n"
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        dl.download("nope", tmp_path)


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def fail(url: str, timeout: float = 0) -> None:
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(urllib.request, "urlopen", fail)


def test_offline_download_fails_in_one_line_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch)
    dest = tmp_path / "traces"
    with pytest.raises(dl.DownloadError) as info:
        dl.download("mooncake-conversation", dest)
    msg = str(info.value)
    assert "\n" not in msg and "mooncake-conversation" in msg and "name resolution" in msg
    assert not dest.exists()  # no empty directory left behind


def test_fetch_trace_cli_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from br_serve.cli import main

    _offline(monkeypatch)
    dest = tmp_path / "t"
    assert main(["fetch-trace", "mooncake-conversation", "--dest", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("br-serve fetch-trace: error: cannot download mooncake-conversation")
    assert err.count("\n") == 1 and "Traceback" not in err and "URLError" not in err
    assert not dest.exists()


def test_interrupted_download_removes_part_file_and_new_dirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def __enter__(self) -> Broken:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self, n: int) -> bytes:
            self.calls += 1
            if self.calls > 1:
                raise ConnectionResetError("connection reset by peer")
            return b"x" * 10

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=0: Broken())
    (tmp_path / "keep").mkdir()
    with pytest.raises(dl.DownloadError, match="connection reset"):
        dl.download("burstgpt", tmp_path / "keep" / "traces")
    assert list((tmp_path / "keep").iterdir()) == []  # "keep" existed: it stays


def test_layout_matches_the_readme() -> None:
    assert dl.target("mooncake-conversation", "traces") == Path(
        "traces/mooncake/conversation_trace.jsonl")
    assert dl.target("azure2023-conv", "d") == Path("d/azure2023/AzureLLMInferenceTrace_conv.csv")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "br-serve fetch-trace mooncake-conversation" in readme
    assert "--trace traces/mooncake/conversation_trace.jsonl" in readme
