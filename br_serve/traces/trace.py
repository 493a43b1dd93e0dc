"""The :class:`Trace` value and the filters applied to it after loading.

A trace is a column store of requests sorted by arrival: ``arrival_s`` (float64, seconds,
ascending, first request at 0), ``input_tokens`` and ``output_tokens`` (int64), and
optional per-request prompt-block hashes (``hash_ids``, Mooncake style).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
HashIds = tuple[tuple[int, ...], ...]


def _ro(a: npt.ArrayLike, dtype: type) -> npt.NDArray[np.generic]:
    arr: npt.NDArray[np.generic] = np.array(a, dtype=dtype, copy=True)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests of one workload, in arrival order.

    Invariants (checked by :meth:`build`): all columns have the same length;
    ``arrival_s`` is ascending and starts at 0 (empty traces excepted);
    ``input_tokens >= 0``; ``output_tokens >= 1``. Arrays are read-only.
    ``skipped_lines`` counts malformed lines skipped with ``skip_bad``;
    ``dropped_rows`` counts well-formed rows dropped because they produced no output
    (e.g. failed requests in BurstGPT).
    """

    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    hash_ids: HashIds | None = None
    source: str = ""
    skipped_lines: int = 0
    dropped_rows: int = 0

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    @staticmethod
    def build(arrival_s: npt.ArrayLike, input_tokens: npt.ArrayLike,
              output_tokens: npt.ArrayLike, hash_ids: HashIds | None = None,
              source: str = "", skipped_lines: int = 0, dropped_rows: int = 0) -> Trace:
        """Sort by arrival (stable), shift so the first arrival is 0, validate, freeze.

        Raises:
            ValueError: columns of different lengths, non-finite arrivals, negative
                inputs or outputs below 1 (naming the column).
        """
        arr = np.asarray(arrival_s, dtype=np.float64)
        inp = np.asarray(input_tokens, dtype=np.int64)
        out = np.asarray(output_tokens, dtype=np.int64)
        n = arr.shape[0]
        if inp.shape != (n,) or out.shape != (n,):
            raise ValueError(f"trace {source}: columns of different lengths")
        if hash_ids is not None and len(hash_ids) != n:
            raise ValueError(f"trace {source}: hash_ids has {len(hash_ids)} rows, not {n}")
        if n and not np.isfinite(arr).all():
            raise ValueError(f"trace {source}: arrival_s must be finite")
        if n and inp.min() < 0:
            raise ValueError(f"trace {source}: input_tokens must be >= 0")
        if n and out.min() < 1:
            raise ValueError(f"trace {source}: output_tokens must be >= 1")
        order = np.argsort(arr, kind="stable")
        if n and not (order == np.arange(n)).all():
            arr, inp, out = arr[order], inp[order], out[order]
            if hash_ids is not None:
                hash_ids = tuple(hash_ids[i] for i in order.tolist())
        if n:
            arr = arr - arr[0]
        return Trace(_ro(arr, np.float64), _ro(inp, np.int64),  # type: ignore[arg-type]
                     _ro(out, np.int64), hash_ids, source,  # type: ignore[arg-type]
                     skipped_lines, dropped_rows)

    def take(self, mask_or_index: npt.ArrayLike) -> Trace:
        """Rows selected by a boolean mask or an ascending index array, re-zeroed."""
        sel = np.asarray(mask_or_index)
        idx = np.flatnonzero(sel) if sel.dtype == np.bool_ else sel.astype(np.int64)
        hid = None if self.hash_ids is None else tuple(self.hash_ids[i] for i in idx.tolist())
        return Trace.build(self.arrival_s[idx], self.input_tokens[idx],
                           self.output_tokens[idx], hid, self.source, self.skipped_lines,
                           self.dropped_rows)

    def scaled(self, arrival_scale: float) -> Trace:
        """Arrival times multiplied by ``arrival_scale`` (0.5 = the same trace twice as fast).

        Raises:
            ValueError: ``arrival_scale`` not positive.
        """
        if not arrival_scale > 0:
            raise ValueError(f"arrival_scale: must be > 0 (got {arrival_scale})")
        if arrival_scale == 1.0:
            return self
        arr = _ro(self.arrival_s * arrival_scale, np.float64)
        return replace(self, arrival_s=arr)  # type: ignore[arg-type]

    def saturated(self) -> Trace:
        """The same requests, all arriving at t = 0 (order kept)."""
        zeros = _ro(np.zeros(len(self)), np.float64)
        return replace(self, arrival_s=zeros)  # type: ignore[arg-type]


def apply_filters(trace: Trace, *, limit: int | None = None, min_output: int | None = None,
                  max_output: int | None = None, start_s: float | None = None,
                  end_s: float | None = None, arrival_scale: float = 1.0) -> Trace:
    """Filter a trace, in this order: time window, output bounds, limit, time scaling.

    The window ``[start_s, end_s)`` is in seconds from the trace's first arrival;
    ``min_output`` / ``max_output`` are inclusive bounds on ``output_tokens``;
    ``limit`` keeps the first N remaining requests. The result starts at 0 again.

    Raises:
        ValueError: a negative limit, ``min_output > max_output`` or ``end_s <= start_s``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit: must be >= 0 (got {limit})")
    if min_output is not None and max_output is not None and min_output > max_output:
        raise ValueError(f"min_output: {min_output} exceeds max_output {max_output}")
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise ValueError(f"end_s: {end_s} must exceed start_s {start_s}")
    keep = np.ones(len(trace), dtype=bool)
    if start_s is not None:
        keep &= trace.arrival_s >= start_s
    if end_s is not None:
        keep &= trace.arrival_s < end_s
    if min_output is not None:
        keep &= trace.output_tokens >= min_output
    if max_output is not None:
        keep &= trace.output_tokens <= max_output
    idx = np.flatnonzero(keep)
    if limit is not None:
        idx = idx[:limit]
    out = trace if idx.shape[0] == len(trace) else trace.take(idx)
    return out.scaled(arrival_scale)
