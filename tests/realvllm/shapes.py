"""Shapes of OpenAI-style answers, for comparing two servers field by field.

A JSON value's shape keeps every key and the type of every leaf (``str``, ``int``,
``float``, ``bool``, ``null``); a list is the shape of its first element. An SSE body's
shape is the list of its events' shapes, runs of equal shapes collapsed to one with
``*``, plus how each event is framed (``data: `` prefix, blank-line separator).
"""

from __future__ import annotations

import json
from typing import Any


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return "null"
    return type(value).__name__


def sse_events(raw: bytes) -> list[Any]:
    """The events of an SSE body: parsed JSON, ``"[DONE]"``, or ``("bad-frame", text)``."""
    text = raw.decode(errors="replace")
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        if not block.startswith("data: ") or "\n" in block.strip():
            events.append(("bad-frame", block[:80]))
            continue
        payload = block[len("data: "):]
        events.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    if text and not text.endswith("\n\n"):
        events.append(("bad-frame", "body does not end with a blank line"))
    return events


def stream_shape(raw: bytes) -> list[str]:
    """One line per run of equal event shapes: ``<shape>`` or ``<shape> *``."""
    out: list[str] = []
    last: str | None = None
    for ev in sse_events(raw):
        s = ev if isinstance(ev, str) else json.dumps(shape(ev), sort_keys=True)
        if isinstance(ev, tuple):
            s = f"bad-frame: {ev[1]}"
        if s == last:
            if not out[-1].endswith(" *"):
                out[-1] += " *"
            continue
        out.append(s)
        last = s
    return out


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two shapes differ, one line each (``path: a-side | b-side``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        lines = []
        for k in sorted(set(a) | set(b)):
            p = f"{path}.{k}" if path else k
            if k not in a:
                lines.append(f"{p}: absent | {json.dumps(b[k])}")
            elif k not in b:
                lines.append(f"{p}: {json.dumps(a[k])} | absent")
            else:
                lines.extend(diff(a[k], b[k], p))
        return lines
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) == 1:
        return diff(a[0], b[0], f"{path}[0]")
    if a != b:
        return [f"{path or '.'}: {json.dumps(a)} | {json.dumps(b)}"]
    return []
