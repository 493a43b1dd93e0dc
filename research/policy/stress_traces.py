"""Seeded stress workloads for the saturated fairness/gain matrix (issue 26).

``chat-rag``: a bursty mix of short chat prompts (70%, median 300 tokens) and very long
RAG prompts (30%, median 12,000), both with long lognormal outputs (median 600).
``reasoning``: short prompts with long Pareto outputs (alpha 1.3, median 1,500, up to
32,000). Written as canonical JSONL (``--format jsonl``); same seed, same file.

    python research/policy/stress_traces.py OUT_DIR [--requests 6000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from br_serve.traces import SyntheticSpec, synthetic_trace
from br_serve.traces.synthetic import LengthDist


def chat_rag(n: int, seed: int) -> list[dict[str, float | int]]:
    base = synthetic_trace(SyntheticSpec(
        requests=n, seed=seed, arrival="bursty", rate_per_s=4.0, burst_factor=4.0,
        burst_share=0.2, input=LengthDist(median=300, sigma=0.8, min_tokens=16),
        output=LengthDist(median=600, sigma=0.9, min_tokens=16, max_tokens=8192)))
    rng = np.random.default_rng(seed + 1)
    rag = rng.random(n) < 0.3
    long_in = np.clip(rng.lognormal(np.log(12000), 0.6, n), 2000, 100000).astype(np.int64)
    inp = np.where(rag, long_in, base.input_tokens)
    return [{"arrival_s": float(a), "input_tokens": int(i), "output_tokens": int(o)}
            for a, i, o in zip(base.arrival_s, inp, base.output_tokens, strict=True)]


def reasoning(n: int, seed: int) -> list[dict[str, float | int]]:
    t = synthetic_trace(SyntheticSpec(
        requests=n, seed=seed, arrival="poisson", rate_per_s=2.0,
        input=LengthDist(median=500, sigma=1.0, min_tokens=16, max_tokens=16000),
        output=LengthDist(kind="pareto", median=1500, alpha=1.3, min_tokens=50,
                          max_tokens=32000)))
    return [{"arrival_s": float(a), "input_tokens": int(i), "output_tokens": int(o)}
            for a, i, o in zip(t.arrival_s, t.input_tokens, t.output_tokens, strict=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, fn in (("chat_rag", chat_rag), ("reasoning", reasoning)):
        rows = fn(a.requests, a.seed)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {out / name}.jsonl: {len(rows)} requests")


if __name__ == "__main__":
    main()
