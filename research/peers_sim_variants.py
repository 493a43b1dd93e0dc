"""The simulator's models of the real routers' rules under other options, on bench-peers'
saturated windows: which modelling choice moves the simulated gain over round robin.

    python research/peers_sim_variants.py G SLOTS TRACE WINDOW

(K = 4 windows, outputs clipped to 128, prompts to 16384, engine.slowdown=2: the
options of results/peers/*.json). Prints each variant's simulated tokens per busy second
per window and its mean paired gain over ``round_robin`` and ``router_round_robin``.
"""

from __future__ import annotations

import sys

from br_serve.bench import peers
from br_serve.bench.serve_report import simulate_one
from br_serve.serve.config import parse_graph_config
from br_serve.traces import Trace

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
    base = parse_graph_config({"replicas": str(g), "slots": str(slots),
                               "engine.slowdown": "2", "pool_capacity": "4096"})
    ws = peers.windows(trace, 4, n, 16384, 128, base.seed)
    res = {}
    for name, opts in VARIANTS:
        cfg = parse_graph_config(base, policy={"name": name, "options": opts})
        res[(name, str(opts))] = [
            simulate_one(Trace.build([0.0] * len(w.arrival_s), list(w.prompt_tokens),
                                     list(w.output_tokens)), cfg)["throughput_tok_s"]
            for w in ws]
    rr, rrr = res[("round_robin", "{}")], res[("router_round_robin", "{}")]
    for (vname, vopts), t in res.items():
        def gain(b: list[float], t: list[float] = t) -> float:
            return 100 * sum(x / y - 1 for x, y in zip(t, b, strict=True)) / len(t)
        print(f"{vname:20s} {vopts:50s} {[round(x) for x in t]} vs round_robin "
              f"{gain(rr):+.1f}% vs router_round_robin {gain(rrr):+.1f}%")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
