"""Upper bounds on the stationary throughput any router can reach on a heterogeneous
cluster, against what token and time-aware BR-0 measured (results/time-aware/time_aware.json).

Why: on ServeGen R1 with half the replicas 1.5x slower, time-aware BR-0 gains ~5% over
token BR-0 and the goal is +10%. Is +10% reachable at all? This computes a fluid
bound from the trace's own requests and the setting's step coefficients.

The bound. Steps are synchronous and a step lasts ``max_g t_g`` with
``t_g = a_g L_g + c_g N_g + b_g``, so over any run the mean step time ``tau`` is at least
every replica's mean ``a_g E[L_g] + c_g E[N_g] + b_g``. A request of prompt ``p`` and
``o`` output tokens occupies a slot for ``o`` steps (its *slot-steps*) and adds
``o p + o (o - 1) / 2`` to the sum of ``L_g`` over those steps (its *token-steps*). In
the stationary regime every request is served, so the replicas together serve the
trace's mix; what a router decides is which part of the mix each replica serves and
how full it runs (``E[N_g] <= B``; leaving slots empty is allowed). Throughput is
``sum_g E[N_g] / tau`` tokens per second. For a split of the mix between the replica
types, the best rate fills the binding type's slots, which gives a closed form; the
bound is its maximum over splits. Three kinds of router:

- ``blind``: cannot tell requests apart before they run (no output-length knowledge,
  prompts not used): every replica serves the mix's average token-steps per
  slot-step;
- ``prompt``: may split by prompt length (here outputs are independent of prompts, so
  a request's expected token-steps per slot-step rise with its prompt);
- ``clairvoyant``: knows every request's output length too.

For a share of the slot-steps on the slower type, the token-steps it can be given lie
between those of the requests lowest and highest in the router's ranking; the best is
the value that equalises the two types' mean step times, clipped to that range (a
fractional knapsack, so this is the optimum of the fluid model, not a heuristic).

Fluid: per-step fluctuations (which make a real step's max exceed the means) are
ignored, so each bound is above what a router can reach. Usage::

    python -m research.hetero_bound [--json results/time-aware/hetero_bound.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from br_serve.bench.workloads import STEP_A, STEP_B, load_workload

G, B = 8, 16
#: replica types per setting: (count, a s/token, b s, c s/request); the drift setting
#: is its post-drift state (replica 0 at 2x)
SETTINGS: dict[str, list[tuple[int, float, float, float]]] = {
    "homogeneous": [(G, STEP_A, STEP_B, 0.0)],
    "half-slow": [(G // 2, STEP_A, STEP_B, 0.0), (G // 2, 1.5 * STEP_A, 1.5 * STEP_B, 0.0)],
    "drift (after)": [(G - 1, STEP_A, STEP_B, 0.0), (1, 2 * STEP_A, 2 * STEP_B, 0.0)],
}


def _rate(types: list[tuple[int, float, float, float]], slot_steps: list[float],
          token_steps: list[float]) -> float:
    """Tokens/s when type ``t`` serves ``slot_steps[t]`` / ``token_steps[t]`` of the mix
    (any common unit): the stream is scaled until the first type's slots are full."""
    scale = min(n * B / s for (n, *_), s in zip(types, slot_steps, strict=True) if s > 0)
    tau = max(b + scale * (a * w + c * s) / n
              for (n, a, b, c), s, w in zip(types, slot_steps, token_steps, strict=True))
    return scale * sum(slot_steps) / tau


def bound(types: list[tuple[int, float, float, float]], s: np.ndarray, w: np.ndarray,
          key: np.ndarray | None, grid: int = 4001) -> tuple[float, float]:
    """(best tokens/s, slot-step share of the second type) over splits of the mix.

    ``key``: what the router can rank requests by (their token-steps per slot-step is
    monotone in it); None: the blind router. For a share ``phi`` of the slot-steps on
    the second type, the token-steps it can be given range from the ``phi`` lowest-key
    requests' to the highest-key ones' (any value between by mixing); the best is the
    one that equalises the two types' step times, clipped to that range. Two types at
    most.
    """
    total_s, total_w = float(s.sum()), float(w.sum())
    if len(types) == 1:
        return _rate(types, [total_s], [total_w]), 0.0
    (n1, a1, b1, c1), (n2, a2, b2, c2) = types
    if key is None:
        lo_s = hi_s = np.array([0.0, total_s])
        lo_w = hi_w = np.array([0.0, total_w])
    else:
        up = np.argsort(key, kind="stable")
        lo_s = np.concatenate([[0.0], np.cumsum(s[up])])
        lo_w = np.concatenate([[0.0], np.cumsum(w[up])])
        hi_s = np.concatenate([[0.0], np.cumsum(s[up[::-1]])])
        hi_w = np.concatenate([[0.0], np.cumsum(w[up[::-1]])])
    best, best_phi = 0.0, 0.0
    for phi in np.linspace(0.0, 1.0, grid):
        s2 = phi * total_s
        s1 = total_s - s2
        w_lo = float(np.interp(s2, lo_s, lo_w))
        w_hi = float(np.interp(s2, hi_s, hi_w))
        scale = min(n * B / x for n, x in ((n1, s1), (n2, s2)) if x > 0)
        # equal step times: b2 + k (a2 w2 + c2 s2) / n2 = b1 + k (a1 (W - w2) + c1 s1) / n1
        w_eq = ((b1 - b2) / scale + (a1 * total_w + c1 * s1) / n1 - c2 * s2 / n2) / (
            a2 / n2 + a1 / n1)
        w2 = min(max(w_eq, w_lo), w_hi)
        r = _rate(types, [s1, s2], [total_w - w2, w2])
        if r > best:
            best, best_phi = r, float(phi)
    return best, best_phi


def measured(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    if not path.exists():
        return {}
    out = {}
    for c in json.loads(path.read_text())["cells"]:
        if c["mode"] == "stationary":
            out[(c["workload"], c["setting"])] = {
                r["label"]: r["throughput_tok_s_mean"] for r in c["rows"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--measured", type=Path, default=Path("results/time-aware/time_aware.json"))
    args = ap.parse_args()
    meas = measured(args.measured)
    rows: list[dict[str, Any]] = []
    print("| workload | setting | router | bound tok/s | slow share of slot-steps | "
          "token BR-0 | time BR-0 | bound vs token BR-0 |")
    print("|---|---|---|---|---|---|---|---|")
    for wl in ("servegen-r1", "mooncake-conv"):
        tr = load_workload(wl, 0)
        p = tr.input_tokens.astype(np.float64)
        o = tr.output_tokens.astype(np.float64)
        s, w = o, o * p + o * (o - 1) / 2
        for setting, types in SETTINGS.items():
            routers: dict[str, np.ndarray | None] = {"blind": None}
            if len(types) > 1:
                routers["prompt"] = p  # o is independent of p here (corr < 0.1)
                routers["clairvoyant"] = w / np.maximum(s, 1)
            m = meas.get((wl, setting), {})
            for name, key in routers.items():
                thr, phi = bound(types, s, w, key)
                br0, brt = m.get("br0"), m.get("br0-time")
                gain = None if not br0 else thr / br0 - 1
                rows.append({"workload": wl, "setting": setting, "router": name,
                             "bound_tok_s": thr, "slow_share_of_slot_steps": phi,
                             "br0_tok_s": br0, "br0_time_tok_s": brt,
                             "bound_vs_br0": gain})
                slow = "-" if len(types) == 1 else f"{phi:.3f}"
                print(f"| {wl} | {setting} | {name} | {thr:,.0f} | {slow} | "
                      f"{'-' if br0 is None else f'{br0:,.0f}'} | "
                      f"{'-' if brt is None else f'{brt:,.0f}'} | "
                      f"{'-' if gain is None else f'{100 * gain:+.1f}%'} |")
    if args.json:
        args.json.write_text(json.dumps({"G": G, "B": B, "step_a": STEP_A, "step_b": STEP_B,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
