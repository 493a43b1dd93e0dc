"""Workload traces: loaders for the public formats, filters, synthetic generators.

Entry point: :func:`load_trace` (read + filter). The result is a :class:`Trace`:
numpy columns ``arrival_s`` (ascending, starting at 0), ``input_tokens``,
``output_tokens`` and optional Mooncake-style ``hash_ids``.
"""

from __future__ import annotations

from pathlib import Path

from br_serve.traces.loaders import FORMATS, detect_format, parse_wallclock_s, read_trace
from br_serve.traces.synthetic import SyntheticSpec, synthetic_trace
from br_serve.traces.trace import Trace, apply_filters

__all__ = [
    "FORMATS",
    "SyntheticSpec",
    "Trace",
    "apply_filters",
    "detect_format",
    "load_trace",
    "parse_wallclock_s",
    "read_trace",
    "synthetic_trace",
]


def load_trace(path: str | Path, fmt: str = "auto", *, limit: int | None = None,
               min_output: int | None = None, max_output: int | None = None,
               start_s: float | None = None, end_s: float | None = None,
               arrival_scale: float = 1.0, skip_bad: bool = False) -> Trace:
    """Read ``path`` (format ``fmt`` or detected) and apply :func:`apply_filters`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``"<file>:<line>: ..."`` for a malformed line (unless ``skip_bad``,
            which skips it and counts it in ``Trace.skipped_lines``), an unknown format,
            or a bad filter argument (named).
    """
    trace = read_trace(path, fmt, skip_bad=skip_bad)
    return apply_filters(trace, limit=limit, min_output=min_output, max_output=max_output,
                         start_s=start_s, end_s=end_s, arrival_scale=arrival_scale)
