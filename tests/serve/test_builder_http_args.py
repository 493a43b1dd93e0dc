"""``serve run graphs.balance_route:build host=... port=...`` is refused, not ignored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from br_serve.serve.config import GraphConfigError

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("key", ["host", "port"])
def test_builder_refuses_http_address_arguments(key: str) -> None:
    from graphs.balance_route import build

    with pytest.raises(GraphConfigError, match=rf"^{key}: cannot be a builder argument.*"
                                               r"http_options"):
        build({key: "9000" if key == "port" else "0.0.0.0", "replicas": "2"})
    with pytest.raises(GraphConfigError, match=rf"^serve.{key}: cannot be a builder"):
        build({f"serve.{key}": "9000" if key == "port" else "0.0.0.0"})
    with pytest.raises(GraphConfigError, match=rf"^serve.{key}: cannot be a builder"):
        build({"serve": {key: "9000" if key == "port" else "0.0.0.0"}})
    assert build({"replicas": "2"}) is not None  # everything else still builds


@pytest.mark.slow
def test_serve_run_fails_fast_with_the_message() -> None:
    """The real CLI: the builder runs before Ray starts, so this starts no cluster."""
    serve = Path(sys.executable).parent / "serve"
    if not serve.exists():
        pytest.skip("the serve CLI is not installed next to this Python")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    r = subprocess.run([str(serve), "run", "graphs.balance_route:build", "port=9000"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "port: cannot be a builder argument" in r.stdout + r.stderr
    assert "Started a local Ray instance" not in r.stdout + r.stderr
