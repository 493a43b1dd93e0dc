"""Where the bounded hold acts: the load share of the step at each hold, per regime.

The hold (docs/core.md, "Bounded hold") keeps back a request whose prompt overflows
every open replica, to buy balance. Balance buys step time only in proportion to the
load terms' share of the step (``a L + c N`` over ``a L + c N + b`` on the barrier
replica, ``br_serve.core.shares.load_share``): where the fixed cost ``b`` dominates, a
better placement barely shortens the step. This runs br0 with the load-share gate off
(``hold_min_load_share=0``, the hold as it was before the gate) and prints the
distribution of that share at every tick that held a request, with the share of holds
the default gate (0.4) would have let through.

Two regimes:

- ``bench``: the peer bench's cell (``--trace --replicas --slots --window --windows``),
  arrival-timed at ``--scale``, ticking per delivery (what the live graph does);
- ``capacity ARGS...``: ``br-serve capacity ARGS`` run in-process (give one policy,
  ``--policy-option br0.hold_min_load_share=0`` and a bracket around its capacity).

    PYTHONPATH=. python -m research.hold_load_share bench --trace T --replicas 8 \
        --slots 4 --window 64 --windows 16 --scale 2.0 [--json OUT]
    PYTHONPATH=. python -m research.hold_load_share capacity --trace T --replicas 8 \
        --policies br0 ... [--json OUT]
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

import br_serve.core.shares as shares_mod
import br_serve.core.tick as tick

DEFAULT_GATE = 0.4


def record() -> list[float]:
    """Spy on the tick: the load share seen by each shallow tick that held a request."""
    shares: list[float] = []
    last: list[float] = [float("nan")]
    orig_share, orig_place = shares_mod.load_share, tick._place_each

    def share(cluster: Any) -> float:
        last[0] = orig_share(cluster)
        return last[0]

    def place(*args: Any) -> tuple[int, float | None]:
        held, retick = orig_place(*args)
        if held and not np.isnan(last[0]):
            shares.append(last[0])
        last[0] = float("nan")  # a share belongs to the tick that computed it
        return held, retick

    tick.load_share = share  # type: ignore[attr-defined]  # the name the tick calls
    tick._place_each = place  # type: ignore[assignment]
    return shares


def bench(argv: list[str]) -> dict[str, Any]:
    from research.capacity_ttft_sim import run_arm
    from research.peers_common import bench_cell, cell_parser
    ap = cell_parser(__doc__)
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    base, windows = bench_cell(a.trace, a.replicas, a.slots, a.window, a.windows)
    run_arm(base, windows, "br0", {"hold_min_load_share": 0.0}, 2, [a.scale], 0.0, True)
    return {"regime": "bench", "argv": argv, "json": a.json}


def capacity(argv: list[str]) -> dict[str, Any]:
    from br_serve.cli import main
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    main(["capacity", *argv])
    return {"regime": "capacity", "argv": argv, "json": out}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("bench", "capacity"):
        sys.exit(__doc__)
    shares = record()
    run = bench if sys.argv[1] == "bench" else capacity
    info = run(sys.argv[2:])
    a = np.array(shares)
    q = [0.1, 0.25, 0.5, 0.75, 0.9]
    summary = {
        "regime": info["regime"], "argv": info["argv"], "holding_ticks": int(a.size),
        "load_share_quantiles": dict(zip([str(x) for x in q],
                                         np.quantile(a, q).round(3).tolist()
                                         if a.size else [None] * len(q), strict=True)),
        "share_at_or_above_default_gate": float((a >= DEFAULT_GATE).mean()) if a.size else None,
    }
    print(json.dumps(summary, indent=2))
    if info["json"]:
        with open(info["json"], "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
