"""`br-serve emulate-engine` as a real process: start-up line, a killed decode server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from br_serve.remote.client import RemoteEngineClient, Timeouts
from br_serve.remote.errors import StreamBroken
from tests.emulator.helpers import config, expected_texts, servers, vllm_pd
from tests.serve.helpers import free_port

pytestmark = pytest.mark.slow


def launch(*args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "br_serve.cli", "emulate-engine", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"emulator exited with {proc.wait()}")
    return proc, json.loads(line)


@pytest.fixture()
def decoders() -> Iterator[list[tuple[subprocess.Popen[str], dict[str, Any]]]]:
    procs = [launch("--protocol", "vllm", "--role", "decode", "--port", str(free_port()),
                    "--step-b-s", "0.01") for _ in range(2)]
    try:
        yield procs
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_killed_decode_server_breaks_its_stream_only(decoders: list[Any]) -> None:
    (victim, vinfo), (_, sinfo) = decoders
    assert vinfo["ready"] and vinfo["protocol"] == "vllm" and vinfo["role"] == "decode"
    body = {"model": "emulated", "prompt": "k l", "max_tokens": 60}
    with servers(config("vllm", "prefill")) as (p,):
        async def go() -> tuple[Any, Any]:
            async with RemoteEngineClient(Timeouts(stall_s=5)) as c:
                doomed = asyncio.ensure_future(vllm_pd(c, p.url, vinfo["urls"][0], body,
                                                       "doomed", None))
                safe = asyncio.ensure_future(vllm_pd(c, p.url, sinfo["urls"][0], body,
                                                     "safe", None))
                await asyncio.sleep(0.25)
                victim.kill()  # SIGKILL: no goodbye on the socket
                res = await asyncio.gather(doomed, safe, return_exceptions=True)
                return res[0], res[1]
        doomed, safe = asyncio.run(go())
    assert isinstance(doomed, StreamBroken), doomed
    assert safe.texts == expected_texts("k l", 60)


def test_bad_flag_exits_2_naming_it() -> None:
    r = subprocess.run([sys.executable, "-m", "br_serve.cli", "emulate-engine", "--protocol",
                        "vllm", "--role", "decode", "--port", "8000", "--dp-size", "2",
                        "--step-b-s", "0.1,0.2,0.3"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60)
    assert r.returncode == 2 and "--step-b-s: need 1 or 2 values" in r.stderr
