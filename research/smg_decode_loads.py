"""What smg's decode-rank rules see of the engines' load in PD mode: run smg at
``--log-level debug`` in front of the engine emulator (SGLang protocol, G = 4), send 40
concurrent completions per configuration and read smg's own log lines:

- its selection lines (smg 1.13 logs ``<rule> selected URL (score S, in_flight N)`` from
  ``least_load.rs`` for ``power_of_two`` and ``least_load``; smg 1.9's
  ``power_of_two.rs`` logged ``Power-of-two selection (METRIC): ...``);
- its load monitor's per-group lines (``Fetched loads from n/m polled workers`` /
  ``No loads fetched``) and the DP-rank cache updates (``update_dp_loads map:``);
- the decode rank of every request (``PD selected DP ranks ... decode=Some(r)``).

Configurations: ``power_of_two``, ``least_load`` and ``--dp-minimum-tokens-scheduler``
with ``--dp-aware`` (as ``bench-peers`` ran every smg arm until this script), and the
last without it (as it runs now). The JSON feeds docs/peers.md, "What smg's rules see".

    PYTHONPATH=. python research/smg_decode_loads.py results/peers/smg_decode_loads.json
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from importlib.metadata import version
from typing import Any

from br_serve.bench.peers_routers import ARMS, router_command
from br_serve.emulator.config import EmulatorConfig
from research.vllm_router_p2c_loads import N, run_logged
from tests.emulator.helpers import servers
from tests.serve.helpers import free_port

G = 4
CONFIGS = (("smg:power_of_two", True), ("smg:least_load", True),
           ("smg:min_tokens", True), ("smg:min_tokens", False))
_SEL = re.compile(r"(\w+) selected (\S+) \(score (-?[\d.]+), in_flight (\d+)\)")
_POLL = re.compile(r"(Fetched loads from \d+/\d+ polled workers|No loads fetched) "
                   r"(?:in |for )group ([^\s,]+)")
_DP = re.compile(r"update_dp_loads map:(\{.*\})")
_RANK = re.compile(r"PD selected DP ranks prefill=\S+ decode=Some\((\d+)\)")


def _one(label: str, dp_aware: bool) -> dict[str, Any]:
    pre = EmulatorConfig("sglang", "prefill", 1, free_port())
    dec = EmulatorConfig("sglang", "decode", G, free_port(), step_a_s_per_token=(0.0,),
                         step_b_s=(0.05,), slots=4)
    with servers(pre, dec) as (p, d):
        port = free_port()
        cmd = ["debug" if x == "warn" else x
               for x in router_command(ARMS[label], port, p.url, d.url, G, dp_aware)]
        status, st, text = run_logged(cmd, port, d.url)
        decode_url = d.url
    sel = [m.groups() for m in _SEL.finditer(text)]
    dp_maps = _DP.findall(text)
    return {
        "arm": label, "dp_aware": dp_aware, "status": dict(Counter(status)),
        "admitted_per_rank": [len(r["admitted"]) for r in st["ranks"]],
        "decode_ranks_in_order": [int(r) for r in _RANK.findall(text)],
        "selections": len(sel),
        "score_equals_in_flight": sum(1 for s in sel if float(s[2]) == float(s[3])),
        "in_flight_at_selection": dict(sorted(Counter(int(s[3]) for s in sel).items())),
        "load_polls": dict(Counter(f"{g.split(':')[1]}: {what}"
                                   for what, g in _POLL.findall(text))),
        "decode_in_dp_rank_cache": sum(1 for m in dp_maps if decode_url in m),
        "dp_rank_cache_updates": dp_maps[:4],
        "sample": [f"{s[0]} selected {s[1]} (score {s[2]}, in_flight {s[3]})"
                   for s in sel[:4]]}


def main(out: str) -> None:
    res = {"router": f"smg {version('smg')}", "dp_size": G, "concurrent_requests": N,
           "runs": [_one(label, dp_aware) for label, dp_aware in CONFIGS]}
    print(json.dumps(res, indent=2))
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
