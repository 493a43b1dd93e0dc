"""The field's real routers as ``bench-peers`` starts them: which binary, which flags.

Each :class:`Arm` is one router with one decode rule, in front of one protocol's engines
(SGLang's routers speak the SGLang PD protocol, vllm-router vLLM's). The routers are the
PyPI wheels of the ``[peers]`` extra, run as ``python -m <module>`` (sglang-router and
smg both install a ``smg`` script, so the scripts clash; the modules do not):

- ``smg`` (SGLang Model Gateway 1.13.0, module ``smg``): ``launch --pd-disaggregation
  --prefill URL BOOTSTRAP_PORT --decode URL --dp-aware``, each decode rank one worker
  ``URL@rank``; rules ``round_robin``, ``power_of_two``, ``cache_aware``, ``least_load``.
  The DP-rank rule ``--dp-minimum-tokens-scheduler`` runs without ``--dp-aware``: under
  it smg's load poll of a ``URL@rank`` worker never reaches the engine, so the rule has
  no decode loads and the rank falls to the worker policy (round robin); without it the
  decode worker is ``URL``, the poll reaches the engine and the rule picks the rank
  (``research/smg_decode_loads.py``; :attr:`Arm.dp_aware`).
- ``sglang-router`` (0.3.2, module ``sglang_router.launch_router``): the same flags.
  Its PD router with ``--dp-aware`` sends the decode request to the worker's
  ``http://host:port@rank`` name unsplit (read as user-info ``host:port`` and host
  ``rank``: 0.0.0.0, 0.0.0.3, ...), so every request fails; without ``--dp-aware`` it
  works but cannot choose a rank (the engine's own DP controller, round robin, does).
  It is run that way, by the contract test only.
- ``vllm-router`` (0.1.17, module ``vllm_router.launch_router``):
  ``--vllm-pd-disaggregation --prefill URL --decode URL
  --intra-node-data-parallel-size G``, ranks pinned with ``X-data-parallel-rank``;
  rules ``round_robin``, ``power_of_two``, ``consistent_hash``.

Every router binds 127.0.0.1 on a free port; the engines are never started lenient
beyond what the real engines are (unknown fields accepted, as vLLM and SGLang do).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: router name -> (python module to run, the wheel that brings it)
ROUTERS = {
    "smg": ("smg", "smg==1.13.0"),
    "sglang-router": ("sglang_router.launch_router", "sglang-router==0.3.2"),
    "vllm-router": ("vllm_router.launch_router", "vllm-router==0.1.17"),
}
PROTOCOL = {"smg": "sglang", "sglang-router": "sglang", "vllm-router": "vllm"}


@dataclass(frozen=True, slots=True)
class Arm:
    """One router with one decode rule (or the graph, ``router == "graph"``).

    ``sim_policy``: the simulator policy that claims to model this rule (``None``: none
    does), with ``sim_options`` (``(name, value)`` pairs); ``args``: the rule's flags;
    ``dp_aware``: start an SGLang-protocol router with ``--dp-aware`` (each decode rank
    its own worker), which every rule that chooses a rank among workers needs.
    """

    label: str
    router: str
    rule: str
    args: tuple[str, ...]
    sim_policy: str | None
    sim_options: tuple[tuple[str, str], ...] = ()
    dp_aware: bool = True

    @property
    def protocol(self) -> str | None:
        return PROTOCOL.get(self.router)

    @property
    def starts_dp_aware(self) -> bool | None:
        """Whether the router starts with ``--dp-aware`` (``None``: not an SGLang-protocol
        router, where the flag does not exist)."""
        return self.dp_aware if self.protocol == "sglang" else None

    @property
    def flags(self) -> tuple[str, ...]:
        """The rule's flags as the router starts with them, ``--dp-aware`` included."""
        return (*self.args, *(("--dp-aware",) if self.starts_dp_aware else ()))


#: arrival binding: the real routers choose the rank when the request arrives (docs/peers.md)
_AT_ARRIVAL = (("bind", "arrival"),)
#: no engine load report reaches the rule (smg's poll with --dp-aware; docs/peers.md)
_NO_REPORTS = ("load_reports", "none")

#: every rule bench-peers knows, by label, with the simulator policy (and options) that
#: models it as bench-peers runs it (docs/peers.md, "Simulator against the real routers")
ARMS: dict[str, Arm] = {a.label: a for a in (
    Arm("smg:round_robin", "smg", "round_robin", ("--policy", "round_robin"),
        "router_round_robin"),
    # smg 1.13 with --dp-aware polls no decode load (a URL@rank worker's poll never
    # reaches the engine): both rules run on the router's in-flight counts
    Arm("smg:power_of_two", "smg", "power_of_two", ("--policy", "power_of_two"),
        "smg_power_of_two", (*_AT_ARRIVAL, _NO_REPORTS)),
    Arm("smg:cache_aware", "smg", "cache_aware", ("--policy", "cache_aware"),
        "smg_cache_aware"),
    Arm("smg:least_load", "smg", "least_load", ("--policy", "least_load"), "smg_least_load",
        (*_AT_ARRIVAL, _NO_REPORTS)),
    # without --dp-aware, so the rule reads the polled per-rank loads; the worker policy
    # round_robin reads no request text: +1 per request between polls
    Arm("smg:min_tokens", "smg", "dp_minimum_tokens",
        ("--policy", "round_robin", "--dp-minimum-tokens-scheduler"), "smg_min_tokens",
        (*_AT_ARRIVAL, ("min_tokens_increment", "one")), dp_aware=False),
    Arm("vllm-router:round_robin", "vllm-router", "round_robin", ("--policy", "round_robin"),
        "router_round_robin"),
    # 0.1.17's PD path never counts a decode request on its worker: both draws read 0
    Arm("vllm-router:power_of_two", "vllm-router", "power_of_two",
        ("--policy", "power_of_two"), "vllm_router_p2c",
        (*_AT_ARRIVAL, ("p2c_loads", "none"))),
    Arm("vllm-router:consistent_hash", "vllm-router", "consistent_hash",
        ("--policy", "consistent_hash"), "consistent_hash"),
)}


def router_available(router: str) -> str | None:
    """``None`` when ``router``'s module imports here, else why not (for a skip)."""
    module, wheel = ROUTERS[router]
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return (f"{router}: module {top!r} is not installed (pip install "
                f"'br-serve[peers]' or {wheel})")
    return None


def router_command(arm: Arm, port: int, prefill_url: str, decode_url: str,
                   dp_size: int, dp_aware: bool | None = None,
                   metrics_port: int = 0) -> list[str]:
    """The command line that starts ``arm``'s router on 127.0.0.1:``port``, its
    Prometheus exporter on 127.0.0.1:``metrics_port`` (``0``: a free port now);
    ``dp_aware``: ``None`` takes ``arm.dp_aware``. Every
    router binds 0.0.0.0:29000 for Prometheus by default and panics at start-up when
    that port is taken, so two routers on one host (a bench beside a test, two users)
    would make each other fail."""
    module, _ = ROUTERS[arm.router]
    base = [sys.executable, "-m", module]
    if arm.router == "smg":
        base.append("launch")
    common = ["--host", "127.0.0.1", "--port", str(port),
              "--prometheus-host", "127.0.0.1",
              "--prometheus-port", str(metrics_port or _free_port()),
              "--worker-startup-timeout-secs", "60", "--log-level", "warn"]
    if arm.protocol == "sglang":
        bootstrap = prefill_url.rsplit(":", 1)[1]
        cmd = [*base, *common, "--pd-disaggregation", "--prefill", prefill_url, bootstrap,
               "--decode", decode_url]
        if arm.starts_dp_aware if dp_aware is None else dp_aware:
            cmd.append("--dp-aware")
    else:
        common[-1] = "warning"
        cmd = [*base, *common, "--vllm-pd-disaggregation", "--prefill", prefill_url,
               "--decode", decode_url, "--intra-node-data-parallel-size", str(dp_size)]
    return [*cmd, *arm.args]


def wait_ready(url: str, model: str, proc: subprocess.Popen[bytes], wait_s: float) -> None:
    """Until one two-token completion goes through the router (its workers are then
    registered and healthy).

    Raises:
        RuntimeError: the router exited, or nothing went through within ``wait_s``.
    """
    import httpx

    deadline = time.monotonic() + wait_s
    body = {"model": model, "prompt": "ready", "max_tokens": 2, "seed": 0}
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router at {url} exited with {proc.returncode}")
        try:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=30.0)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.5)
    raise RuntimeError(f"router at {url} not ready after {wait_s:g} s (last: {last})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_router(arm: Arm, port: int, prefill_url: str, decode_url: str, dp_size: int,
                   model: str, log_path: Path | None = None, dp_aware: bool | None = None,
                   wait_s: float = 90.0) -> Iterator[str]:
    """Start ``arm``'s router, wait until a request goes through, yield its base URL;
    stop it (its process group) on exit."""
    why = router_available(arm.router)
    if why is not None:
        raise RuntimeError(why)
    cmd = router_command(arm, port, prefill_url, decode_url, dp_size, dp_aware)
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "NO_COLOR": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, model, proc, wait_s)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if log_path:
            out.close()  # type: ignore[union-attr]
