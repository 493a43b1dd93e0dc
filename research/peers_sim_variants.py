"""The simulator's models of the real routers' rules under other options, on bench-peers'
saturated windows: which modelling choice moves the simulated gain over round robin.

    python -m research.peers_sim_variants G SLOTS TRACE WINDOW

(K = 4 windows, outputs clipped to 128, prompts to 16384, engine.slowdown=2: the
options of results/peers/*.json). Prints each variant's simulated tokens per busy second
per window and its mean paired gain over ``round_robin`` and ``router_round_robin``.
"""

from __future__ import annotations

import sys

from br_serve.bench.peers_report import SimArm, simulate_windows
from research.peers_common import bench_cell

ARRIVAL = {"bind": "arrival"}
VARIANTS = [("round_robin", {}), ("router_round_robin", {}), ("consistent_hash", {}),
            ("vllm_router_p2c", {}), ("vllm_router_p2c", ARRIVAL),
            ("vllm_router_p2c", {**ARRIVAL, "p2c_loads": "none"}),
            ("smg_power_of_two", {}), ("smg_power_of_two", ARRIVAL),
            ("smg_min_tokens", {}), ("smg_min_tokens", ARRIVAL),
            ("smg_min_tokens", {**ARRIVAL, "min_tokens_increment": "one"}),
            ("smg_least_load", {}), ("smg_least_load", ARRIVAL), ("smg_cache_aware", {}),
            ("jsq", {}), ("br0", {})]


def main(g: int, slots: int, trace: str, n: int) -> None:
    base, ws = bench_cell(trace, g, slots, n, 4)
    sims = simulate_windows(base, ws, {f"{name} {opts}": SimArm(name, opts)
                                       for name, opts in VARIANTS}, saturated=True)
    res = {(name, str(opts)): sims[f"{name} {opts}"]["throughput_tok_s"]
           for name, opts in VARIANTS}
    rr, rrr = res[("round_robin", "{}")], res[("router_round_robin", "{}")]
    for (vname, vopts), t in res.items():
        def gain(b: list[float], t: list[float] = t) -> float:
            return 100 * sum(x / y - 1 for x, y in zip(t, b, strict=True)) / len(t)
        print(f"{vname:20s} {vopts:50s} {[round(x) for x in t]} vs round_robin "
              f"{gain(rr):+.1f}% vs router_round_robin {gain(rrr):+.1f}%")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
