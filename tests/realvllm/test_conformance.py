"""The emulator checked against the engine: the same requests to a real vLLM (CPU build,
tiny model) and to ``br-serve emulate-engine --protocol vllm --role decode``; status
codes, field sets (every key and leaf type) and SSE framing must agree, except the
differences listed in :data:`DELIBERATE` (docs/engine-contracts.md, "Conformance").

``BR_CONFORMANCE_OUT=path.json`` also writes the table of the run (results/vllm/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.realvllm import servers as sv
from tests.realvllm.conftest import Fleet
from tests.realvllm.shapes import diff, shape, sse_events, stream_shape
from tests.serve.helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

P = "w1 w2 w3 w4 w5 w6 w7 w8"
M = sv.SERVED_MODEL
CHAT = [{"role": "user", "content": P}]
#: (name, endpoint, body)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("completion", "completions", {"model": M, "prompt": P, "max_tokens": 5}),
    ("completion-stream", "completions",
     {"model": M, "prompt": P, "max_tokens": 5, "stream": True}),
    ("completion-stream-usage", "completions",
     {"model": M, "prompt": P, "max_tokens": 5, "stream": True,
      "stream_options": {"include_usage": True}}),
    ("completion-stream-continuous-usage", "completions",
     {"model": M, "prompt": P, "max_tokens": 3, "stream": True,
      "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("completion-token-ids", "completions", {"model": M, "prompt": [5, 6, 7], "max_tokens": 2}),
    ("completion-no-model", "completions", {"prompt": P, "max_tokens": 2}),
    ("completion-no-max-tokens", "completions", {"model": M, "prompt": P}),
    ("chat", "chat/completions", {"model": M, "messages": CHAT, "max_tokens": 5}),
    ("chat-max-completion-tokens", "chat/completions",
     {"model": M, "messages": CHAT, "max_completion_tokens": 4}),
    ("chat-stream", "chat/completions",
     {"model": M, "messages": CHAT, "max_tokens": 5, "stream": True}),
    ("chat-stream-usage", "chat/completions",
     {"model": M, "messages": CHAT, "max_tokens": 5, "stream": True,
      "stream_options": {"include_usage": True}}),
    ("stop-string", "completions", {"model": M, "prompt": P, "max_tokens": 5, "stop": ["w9"]}),
    ("unknown-field", "completions",
     {"model": M, "prompt": P, "max_tokens": 2, "no_stop_trim": True, "foo_bar": 1}),
    ("unknown-model", "completions", {"model": "no-such-model", "prompt": P, "max_tokens": 2}),
    ("unknown-model-chat", "chat/completions",
     {"model": "no-such-model", "messages": CHAT, "max_tokens": 2}),
    ("max-tokens-string", "completions", {"model": M, "prompt": P, "max_tokens": "five"}),
    ("max-tokens-zero", "completions", {"model": M, "prompt": P, "max_tokens": 0}),
    ("prompt-int", "completions", {"model": M, "prompt": 5, "max_tokens": 2}),
    ("messages-not-list", "chat/completions", {"model": M, "messages": "hi", "max_tokens": 2}),
    ("stream-not-bool", "completions",
     {"model": M, "prompt": P, "max_tokens": 2, "stream": "yes"}),
    ("stream-options-without-stream", "completions",
     {"model": M, "prompt": P, "max_tokens": 2, "stream_options": {"include_usage": True}}),
    ("over-context-prompt", "completions",
     {"model": M, "prompt": " ".join(f"w{i % 400}" for i in range(sv.MAX_MODEL_LEN + 44)),
      "max_tokens": 2}),
    ("over-context-max-tokens", "completions", {"model": M, "prompt": P, "max_tokens": 10_000}),
    ("over-context-stream", "completions",
     {"model": M, "prompt": P, "max_tokens": 10_000, "stream": True}),
]

#: case -> (why the emulator differs on purpose, (vLLM's status, the emulator's status));
#: any shape difference of such a case is allowed while both statuses are these
DELIBERATE: dict[str, tuple[str, tuple[int, int]]] = {
    "stop-string": ("the emulator's outputs always run to max_tokens: it refuses a "
                    "non-empty stop by name rather than ignoring it", (200, 400)),
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "br_serve.cli", "emulate-engine", "--protocol", "vllm",
         "--role", "decode", "--port", str(port), "--model", M, "--kv-limit-tokens",
         str(sv.MAX_MODEL_LEN), "--step-b-s", "0.002"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        assert line, f"emulator exited with {proc.poll()}"
        yield json.loads(line)["urls"][0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ask(base: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{base}/v1/{endpoint}", json=body, timeout=120)
    streamed = r.headers.get("content-type", "").startswith("text/event-stream")
    events = 0
    if streamed:
        got: Any = stream_shape(r.content)
        events = len(sse_events(r.content))
    else:
        try:
            got = shape(r.json())
        except ValueError:
            got = f"not JSON: {r.text[:80]!r}"
    return {"status": r.status_code, "sse": streamed, "shape": got, "events": events,
            "body": r.text[:600]}


def ask_unmerged(base: str, endpoint: str, body: dict[str, Any], tries: int = 3
                 ) -> dict[str, Any]:
    """:func:`ask` of the real server; a stream is asked up to ``tries`` times and the
    answer with the most events kept. vLLM's API server puts the tokens its output loop
    finds waiting into one chunk, so on a loaded host a 3-token stream can arrive as one
    chunk (seen once in CI: ``repeated False | True`` on the continuous-usage case). The
    shapes compared are those of its unmerged stream, one token per chunk."""
    best = ask(base, endpoint, body)
    for _ in range(tries - 1):
        if not best["sse"]:
            break
        again = ask(base, endpoint, body)
        if again["events"] > best["events"]:
            best = again
    return best


def compare(real: dict[str, Any], emu: dict[str, Any]) -> list[str]:
    lines = []
    if real["status"] != emu["status"]:
        lines.append(f"status: {real['status']} | {emu['status']}")
    if real["sse"] != emu["sse"]:
        lines.append(f"sse: {real['sse']} | {emu['sse']}")
    if real["sse"] and emu["sse"]:
        a, b = real["shape"], emu["shape"]
        if len(a) != len(b):
            lines.append(f"events: {len(a)} runs | {len(b)} runs")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                xs = json.loads(x.rstrip(" *")) if x.startswith("{") else x
                ys = json.loads(y.rstrip(" *")) if y.startswith("{") else y
                lines.extend(f"event {i}: {d}" for d in diff(xs, ys))
                if x.endswith(" *") != y.endswith(" *"):
                    lines.append(f"event {i}: repeated {x.endswith(' *')} | {y.endswith(' *')}")
    elif not real["sse"] and not emu["sse"]:
        lines.extend(diff(real["shape"], emu["shape"]))
    return lines


def test_emulator_matches_real_vllm(fleet: Fleet, emulator: str) -> None:
    real_url = fleet.decode.url
    rows, unexplained = [], []
    for name, endpoint, body in CASES:
        real, emu = ask_unmerged(real_url, endpoint, body), ask(emulator, endpoint, body)
        found = compare(real, emu)
        why, statuses = DELIBERATE.get(name, ("", None))
        if statuses is None:
            extra, stale = found, []
        else:
            got = (real["status"], emu["status"])
            extra, stale = [], ([] if got == statuses else [f"statuses {got} != {statuses}"])
        rows.append({"case": name, "endpoint": endpoint, "request": body,
                     "vllm_status": real["status"], "emulator_status": emu["status"],
                     "differences": found, "deliberate": why or None,
                     "vllm_body": real["body"], "emulator_body": emu["body"]})
        if extra or stale:
            unexplained.append(f"{name}: new {extra}, documented but gone {stale}")
    out = os.environ.get("BR_CONFORMANCE_OUT")
    if out:
        Path(out).write_text(json.dumps({"model": "tiny random Llama (tests/realvllm/"
                                                  "tinymodel.py)", "rows": rows}, indent=1)
                             + "\n")
    assert not unexplained, "\n".join(unexplained)
