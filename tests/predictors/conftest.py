"""Shared helpers: small running batches built by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from br_serve.core.types import RunningRequests


def running(prompt: Sequence[int], decoded: Sequence[int], *,
            hash_ids: Sequence[tuple[int, ...] | None] | None = None,
            prefix_hash: Sequence[int] | None = None,
            arrival_s: Sequence[float] | None = None) -> RunningRequests:
    n = len(prompt)
    return RunningRequests.build(
        np.zeros(n, np.int64), prompt, decoded, arrival_s=arrival_s, prefix_hash=prefix_hash,
        request_ids=tuple(f"r{j}" for j in range(n)),
        hash_ids=None if hash_ids is None else tuple(hash_ids))
