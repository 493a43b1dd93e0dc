"""``serve run graphs.balance_route:build host=... port=... front=...`` is refused, not ignored;
so is a front door the environment contradicts."""

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


def test_builder_refuses_the_front_door() -> None:
    """``serve.front`` is fixed when Ray starts: refused by name, with what to set."""
    from graphs.balance_route import build

    for args in ({"front": "haproxy"}, {"serve.front": "haproxy"},
                 {"serve": {"front": "proxy"}}):
        with pytest.raises(GraphConfigError,
                           match=r"^serve.front: cannot be a builder.*RAY_SERVE_ENABLE_HA_PROXY"):
            build(args)


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


def test_start_ray_refuses_a_front_the_environment_contradicts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve.front=proxy`` with ``RAY_SERVE_ENABLE_HA_PROXY=1`` in the environment would
    start HAProxy anyway: refused by name before any Ray starts."""
    from br_serve.serve.cli import HAPROXY_ENV, start_ray

    monkeypatch.setenv(HAPROXY_ENV, "1")
    with pytest.raises(GraphConfigError, match=r"^serve.front: is 'proxy' but "
                                               r"RAY_SERVE_ENABLE_HA_PROXY=1"):
        start_ray(1, "proxy")
