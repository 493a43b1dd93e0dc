"""The downloader, against a local file:// source (tests never touch the network)."""

from __future__ import annotations

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
