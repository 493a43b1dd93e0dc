"""The peer bench's cell as the research scripts simulate it: one place for its options.

``bench-peers`` results in ``results/peers/`` were run with outputs clipped to 128,
prompts to 16384 and ``engine.slowdown=2`` (a pool of 4096); the research scripts that
replay the same windows in the simulator build them here, so they cannot drift apart.
"""

from __future__ import annotations

import argparse
from typing import Any

from br_serve.bench import peers
from br_serve.serve.config import parse_graph_config

#: bench-peers' options in results/peers/ (as ``--set`` paths)
SETTINGS = {"engine.slowdown": "2", "pool_capacity": "4096"}
MAX_PROMPT_TOKENS = 16384
MAX_OUTPUT_TOKENS = 128


def bench_cell(trace: str, replicas: int, slots: int, window: int,
               windows: int) -> tuple[Any, list[peers.Window]]:
    """The graph config and the ``windows`` paired windows of ``window`` requests that
    ``bench-peers`` replays for this trace at ``replicas`` x ``slots``."""
    base = parse_graph_config({"replicas": str(replicas), "slots": str(slots), **SETTINGS})
    return base, peers.windows(trace, windows, window, MAX_PROMPT_TOKENS,
                               MAX_OUTPUT_TOKENS, base.seed)


def cell_parser(doc: str | None) -> argparse.ArgumentParser:
    """A research script's parser with the cell's options: ``--trace``, ``--replicas``,
    ``--slots``, ``--window`` (requests per window) and ``--windows`` (K, default 4)."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--window", type=int, required=True)
    ap.add_argument("--windows", type=int, default=4)
    return ap
