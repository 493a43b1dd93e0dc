"""Serve's HAProxy front door (``serve.front=haproxy``): is the direct path up?

Under ``RAY_SERVE_ENABLE_HA_PROXY=1`` Ray writes one HAProxy backend per application,
``http-<app name>``: one server per ingress replica (its own HTTP server, the direct
path) and Serve's Python proxy as a ``backup`` server. HAProxy sends a connection to
the backup while no replica server is UP by its health checks, for the whole life of
that connection. Right after a deploy the replica's server may not be UP yet: a burst
sent then goes through Serve's proxy, the hop this front exists to remove (measured:
one of eight bench sessions sent its whole replay that way, docs/peers.md).
:func:`wait_direct` waits for the direct path; :func:`servers` reads HAProxy's
statistics (its CSV stats page, on 127.0.0.1 at ``RAY_SERVE_HAPROXY_STATS_PORT``,
8404 unless set, as Ray's template binds it).
"""

from __future__ import annotations

import csv
import io
import os
import time
from dataclasses import dataclass

import httpx

#: Ray's default HAProxy stats port (``RAY_SERVE_HAPROXY_STATS_PORT`` overrides it)
DEFAULT_STATS_PORT = 8404


@dataclass(frozen=True, slots=True)
class FrontServer:
    """One server of an application's HAProxy backend."""

    name: str
    status: str          # HAProxy's: UP, DOWN, MAINT, "no check"...
    backup: bool         # Serve's Python proxy (the fallback), not an ingress replica
    sessions_total: int  # connections HAProxy sent it so far


def stats_port() -> int:
    return int(os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT", DEFAULT_STATS_PORT))


def servers(app_name: str, port: int | None = None, timeout_s: float = 5.0
            ) -> list[FrontServer]:
    """The servers of ``app_name``'s backend (empty: no such backend yet).

    Raises:
        httpx.HTTPError: HAProxy's stats page cannot be read.
    """
    r = httpx.get(f"http://127.0.0.1:{port or stats_port()}/stats;csv", timeout=timeout_s)
    r.raise_for_status()
    rows = csv.DictReader(io.StringIO(r.text.lstrip("# ")))
    return [FrontServer(row["svname"], row["status"], row["bck"] == "1",
                        int(row["stot"] or 0))
            for row in rows
            if row["pxname"] == f"http-{app_name}"
            and row["svname"] not in ("FRONTEND", "BACKEND")]


def wait_direct(app_name: str, timeout_s: float, port: int | None = None) -> bool:
    """Wait until HAProxy has an ingress replica of ``app_name`` UP (True), at most
    ``timeout_s`` (False: it still sends new connections to Serve's proxy)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if any(s.status == "UP" and not s.backup for s in servers(app_name, port)):
                return True
        except httpx.HTTPError:
            pass  # HAProxy not (re)started yet
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
