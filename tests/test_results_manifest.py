"""Every results file has a manifest entry whose command and citations are plausible.

``results/<topic>/<name>.json`` plus ``results/<topic>/manifest.json`` keyed by file name:
``commit``, ``command`` (reproduces it), ``schema`` (one line), ``cited_by`` (docs pages).
Checked here: no JSON file without an entry and no entry without a file; the command runs
a driver that exists and names the file it writes; every cited page exists and mentions
the file (by its path, or by a glob such as ``results/lookahead/*.json`` that matches it).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
TOPICS = sorted(p for p in RESULTS.iterdir() if p.is_dir())
_PATH = re.compile(r"results/[A-Za-z0-9_./*-]+")


def _driver_exists(command: str) -> bool:
    """The program the command runs is in this checkout (or is the product's CLI)."""
    try:
        words = shlex.split(command)
    except ValueError:  # prose after the command with an unmatched quote
        words = command.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0], re.S):
        words = words[1:]  # the shell's environment assignments before the program
    if not words:
        return False
    if words[0] == "br-serve":
        return len(words) > 1 and not words[1].startswith("-")
    if words[:3] == ["python", "-m", "pytest"]:  # a test that writes what it measured
        tests = [w.split("::")[0] for w in words[3:] if w.startswith("tests/")]
        return bool(tests) and all((ROOT / t).exists() for t in tests)
    if words[:2] == ["python", "-m"]:
        mod = words[2].replace(".", "/")
        return words[2].split(".")[0] in ("benchmarks", "research") and (
            (ROOT / f"{mod}.py").is_file())
    if words[0] in ("python", "bash"):
        return (words[1].startswith(("benchmarks/", "research/"))
                and (ROOT / words[1]).is_file())
    return False


def mentions(text: str, path: str) -> bool:
    for tok in _PATH.findall(text):
        tok = tok.rstrip(".")
        if tok == path or ("*" in tok and fnmatch.fnmatch(path, tok)):
            return True
    return False


def test_results_are_in_topic_folders() -> None:
    loose = sorted(p.name for p in RESULTS.iterdir() if p.is_file())
    assert loose == [], f"results/ holds files outside a topic folder: {loose}"
    assert TOPICS, "no topic folders under results/"


@pytest.mark.parametrize("topic", TOPICS, ids=lambda p: p.name)
def test_manifest_covers_every_file(topic: Path) -> None:
    man_path = topic / "manifest.json"
    assert man_path.is_file(), f"{topic.name}: no manifest.json"
    man = json.loads(man_path.read_text())
    files = {p.name for p in topic.glob("*.json") if p.name != "manifest.json"}
    assert files - set(man) == set(), f"{topic.name}: files without an entry"
    assert set(man) - files == set(), f"{topic.name}: entries without a file"
    for name, e in man.items():
        path = f"results/{topic.name}/{name}"
        assert set(e) >= {"commit", "command", "schema", "cited_by"}, path
        assert re.fullmatch(r"[0-9a-f]{7,40}", e["commit"]), f"{path}: commit {e['commit']!r}"
        assert e["schema"] and "\n" not in e["schema"], f"{path}: schema must be one line"
        cmd = e["command"]
        assert _driver_exists(cmd), f"{path}: command runs no driver of this checkout: {cmd}"
        assert path in cmd or Path(name).stem in cmd, f"{path}: command does not name it"
        assert e["cited_by"], f"{path}: cited nowhere (cite it in docs/ or remove it)"
        for doc in e["cited_by"]:
            page = ROOT / doc
            assert page.is_file(), f"{path}: cited_by {doc} does not exist"
            assert mentions(page.read_text(), path), f"{path}: {doc} does not mention it"
