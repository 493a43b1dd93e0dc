"""Parsers for the public trace formats, each returning a :class:`Trace`.

Formats (``fmt``):

- ``azure``: Azure LLM inference CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``;
  2023 timestamps ``2023-11-16 18:17:03.9799600`` and 2024 ones
  ``2024-05-10 00:00:00.009930+00:00`` (absolute wall clock, any number of digits).
- ``mooncake``: JSONL with ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids``.
- ``servegen``: CSV with ``arrival_s,input_tokens,output_tokens`` (extra columns ignored).
- ``burstgpt``: BurstGPT CSV, ``Timestamp`` (s), ``Request tokens``, ``Response tokens``;
  rows with zero response tokens (failed requests) are dropped and counted.
- ``jsonl``: canonical JSONL, ``{"arrival_s", "input_tokens", "output_tokens",
  "hash_ids"?}`` per line.

A malformed line raises ``ValueError("<file>:<line>: <what is wrong>")`` unless
``skip_bad`` is set, in which case it is skipped and counted in ``Trace.skipped_lines``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

from br_serve.traces.trace import Trace

FORMATS = ("azure", "mooncake", "servegen", "burstgpt", "jsonl")

Row = tuple[float, int, int, tuple[int, ...] | None]


class _Bad(ValueError):
    """A malformed record; the message says what is wrong (file/line added by caller)."""


def _int(v: Any, field: str) -> int:
    if isinstance(v, bool):
        raise _Bad(f"{field}: expected an integer, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise _Bad(f"{field}: expected an integer, got {v!r}") from None
    if not f.is_integer():
        raise _Bad(f"{field}: expected an integer, got {v!r}")
    i = int(f)
    if i < 0:
        raise _Bad(f"{field}: must be >= 0, got {i}")
    return i


def _float(v: Any, field: str) -> float:
    if isinstance(v, bool):
        raise _Bad(f"{field}: expected a number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise _Bad(f"{field}: expected a number, got {v!r}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise _Bad(f"{field}: must be finite, got {v!r}")
    return f


def _hash_ids(v: Any, field: str = "hash_ids") -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          for x in v):
        raise _Bad(f"{field}: expected a list of integers")
    return tuple(v)


_DAYS: dict[str, int] = {}


def parse_wallclock_s(text: str) -> float:
    """Seconds since 1970-01-01 of ``YYYY-MM-DD[ T]HH:MM:SS[.frac][Z|+HH:MM|-HH:MM]``.

    Handles any number of fractional digits (Azure 2023 writes seven) and a UTC offset
    (Azure 2024 writes ``+00:00``). Raises :class:`ValueError` on anything else.
    """
    s = text.strip()
    if len(s) < 19 or s[10] not in " T":
        raise _Bad(f"TIMESTAMP: not a date-time: {text!r}")
    day_s = s[:10]
    days = _DAYS.get(day_s)
    if days is None:
        try:
            days = date.fromisoformat(day_s).toordinal() - 719163  # 1970-01-01
        except ValueError:
            raise _Bad(f"TIMESTAMP: bad date in {text!r}") from None
        _DAYS[day_s] = days
    rest = s[11:]
    offset = 0.0
    if rest.endswith("Z"):
        rest = rest[:-1]
    elif len(rest) > 6 and rest[-6] in "+-" and rest[-3] == ":":
        try:
            sign = 1 if rest[-6] == "+" else -1
            offset = sign * (int(rest[-5:-3]) * 3600 + int(rest[-2:]) * 60)
        except ValueError:
            raise _Bad(f"TIMESTAMP: bad UTC offset in {text!r}") from None
        rest = rest[:-6]
    try:
        hh, mm, ss = rest.split(":")
        secs = int(hh) * 3600 + int(mm) * 60 + float(ss)
    except ValueError:
        raise _Bad(f"TIMESTAMP: bad time in {text!r}") from None
    return days * 86400.0 + secs - offset


# --- per-format record parsers: record -> Row, raising _Bad ---------------------------

def _azure(rec: dict[str, str]) -> Row:
    return (parse_wallclock_s(rec["TIMESTAMP"]), _int(rec["ContextTokens"], "ContextTokens"),
            _int(rec["GeneratedTokens"], "GeneratedTokens"), None)


def _servegen(rec: dict[str, str]) -> Row:
    return (_float(rec["arrival_s"], "arrival_s"), _int(rec["input_tokens"], "input_tokens"),
            _int(rec["output_tokens"], "output_tokens"), None)


def _burstgpt(rec: dict[str, str]) -> Row:
    return (_float(rec["Timestamp"], "Timestamp"),
            _int(rec["Request tokens"], "Request tokens"),
            _int(rec["Response tokens"], "Response tokens"), None)


def _mooncake(rec: dict[str, Any]) -> Row:
    hid = rec.get("hash_ids")
    return (_float(rec["timestamp"], "timestamp") / 1000.0,
            _int(rec["input_length"], "input_length"),
            _int(rec["output_length"], "output_length"),
            None if hid is None else _hash_ids(hid))


def _jsonl(rec: dict[str, Any]) -> Row:
    hid = rec.get("hash_ids")
    return (_float(rec["arrival_s"], "arrival_s"), _int(rec["input_tokens"], "input_tokens"),
            _int(rec["output_tokens"], "output_tokens"),
            None if hid is None else _hash_ids(hid))


_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "servegen": ("arrival_s", "input_tokens", "output_tokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
_PARSERS: dict[str, Callable[[Any], Row]] = {
    "azure": _azure, "servegen": _servegen, "burstgpt": _burstgpt,
    "mooncake": _mooncake, "jsonl": _jsonl,
}
_JSON_KEYS = {
    "mooncake": ("timestamp", "input_length", "output_length"),
    "jsonl": ("arrival_s", "input_tokens", "output_tokens"),
}


def detect_format(path: Path) -> str:
    """Guess the format from the first non-empty line (CSV header or JSON keys).

    Raises:
        ValueError: naming the file, when no known format matches.
    """
    with path.open(encoding="utf-8-sig") as fh:
        first = ""
        for line in fh:
            if line.strip():
                first = line.strip()
                break
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except json.JSONDecodeError:
            raise ValueError(f"{path}:1: not valid JSON; cannot detect the format") from None
        for fmt, need in _JSON_KEYS.items():
            if set(need) <= keys:
                return fmt
        raise ValueError(f"{path}:1: JSON keys {sorted(keys)} match no known trace format")
    header = {h.strip() for h in next(csv.reader([first]))}
    for fmt, need in _CSV_COLUMNS.items():
        if set(need) <= header:
            return fmt
    raise ValueError(f"{path}:1: header {sorted(header)} matches no known trace format "
                     f"(known: {', '.join(FORMATS)})")


def _csv_records(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = None
        for row in reader:
            if row and any(c.strip() for c in row):
                header = [h.strip() for h in row]
                break
        if header is None:
            return
        missing = [c for c in _CSV_COLUMNS[fmt] if c not in header]
        if missing:
            raise ValueError(f"{path}:{reader.line_num}: missing column(s) {missing} "
                             f"for format {fmt!r}")
        for row in reader:
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                yield reader.line_num, _Bad(f"expected {len(header)} fields, got {len(row)}")
                continue
            yield reader.line_num, dict(zip(header, row, strict=True))


def _json_records(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, _Bad(f"not valid JSON ({exc.msg})")
                continue
            if not isinstance(rec, dict):
                yield lineno, _Bad("expected a JSON object")
                continue
            yield lineno, rec


def read_trace(path: str | Path, fmt: str = "auto", *, skip_bad: bool = False) -> Trace:
    """Parse a whole trace file (no filtering). See the module docstring for formats.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown format, or ``"<file>:<line>: ..."`` for a malformed line.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt not in _PARSERS:
        raise ValueError(f"format: unknown trace format {fmt!r} (known: auto, "
                         f"{', '.join(FORMATS)})")
    parse = _PARSERS[fmt]
    records = _json_records(p) if fmt in _JSON_KEYS else _csv_records(p, fmt)
    arr: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    hids: list[tuple[int, ...]] = []
    any_hash = False
    skipped = dropped = 0
    for lineno, rec in records:
        try:
            if isinstance(rec, _Bad):
                raise rec
            a, i, o, h = parse(rec)
        except KeyError as exc:
            err: Exception = _Bad(f"missing field {exc.args[0]!r}")
        except _Bad as exc:
            err = exc
        else:
            if o < 1:
                dropped += 1
                continue
            arr.append(a)
            inp.append(i)
            out.append(o)
            hids.append(() if h is None else h)
            any_hash = any_hash or h is not None
            continue
        if not skip_bad:
            raise ValueError(f"{p}:{lineno}: {err}") from None
        skipped += 1
    return Trace.build(arr, inp, out, tuple(hids) if any_hash else None,
                       source=f"{fmt}:{p.name}", skipped_lines=skipped, dropped_rows=dropped)
