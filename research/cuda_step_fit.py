"""Fit the decode step-time model ``step_s = a * load_tokens + b`` for the torch engine.

Runs :class:`br_serve.engine.torch_engine.TorchEngine` on a randomly initialised
Llama-shaped model (no downloads), fills one replica with ``B`` requests of ``L``
context tokens each (random KV installed through ``admit``: step time depends on the
KV's size, not its values), times steady decode steps for each ``(B, L)`` of a grid and
fits ``(a, b)`` by least squares over all timed steps. Also reports a fit with a batch
term, ``step_s = a * load + c * B + b``, because per-row work is not free.

What it measures is *this* engine (HF transformers attention + DynamicCache, which
concatenates the cache every step), not a paged-attention server.

    python -m research.cuda_step_fit                  # CUDA, llama-8b shape, bf16
    python -m research.cuda_step_fit --dry-run        # CPU, tiny model, small grid

Writes JSON (``--out``) with the configuration, every timed point and both fits.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from br_serve.engine import device as devmod  # before torch: sets its env

PRESETS: dict[str, dict[str, int]] = {
    # Llama-3-8B shapes (GQA 32/8, head_dim 128), vocab cut to 32k to save memory.
    "llama-8b": dict(vocab_size=32000, hidden_size=4096, layers=32, heads=32, kv_heads=8,
                     intermediate_size=14336),
    # Llama-3.2-1B-like shapes.
    "llama-1b": dict(vocab_size=32000, hidden_size=2048, layers=16, heads=32, kv_heads=8,
                     intermediate_size=8192),
    "tiny": dict(vocab_size=512, hidden_size=64, layers=2, heads=4, kv_heads=2,
                 intermediate_size=256),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--preset", default="llama-8b", choices=sorted(PRESETS))
    p.add_argument("--batches", default="1,8,32,64", help="requests per replica")
    p.add_argument("--contexts", default="256,1024,2048", help="tokens per request")
    p.add_argument("--steps", type=int, default=20, help="timed steps per grid point")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per grid point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="cuda_step_fit.json")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, tiny model, float32, small grid: checks the script runs")
    args = p.parse_args(argv)
    if args.dry_run:
        args.device, args.dtype, args.preset = "cpu", "float32", "tiny"
        args.batches, args.contexts, args.steps, args.warmup = "1,4,8", "16,64", 5, 1
    return args


def fit(loads: list[float], batches: list[float], times: list[float]) -> dict[str, Any]:
    import numpy as np

    x = np.asarray(loads, dtype=float)
    y = np.asarray(times, dtype=float)
    bs = np.asarray(batches, dtype=float)
    a, b = np.polyfit(x, y, 1)
    resid = y - (a * x + b)
    r2 = 1.0 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum() or 1.0)
    design = np.stack([x, bs, np.ones_like(x)], axis=1)
    (a2, c2, b2), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid2 = y - design @ np.array([a2, c2, b2])
    r2_2 = 1.0 - float(resid2 @ resid2) / float(((y - y.mean()) ** 2).sum() or 1.0)
    return {"a_s_per_token": float(a), "b_s": float(b), "r2": r2,
            "with_batch_term": {"a_s_per_token": float(a2), "c_s_per_request": float(c2),
                                "b_s": float(b2), "r2": r2_2}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = devmod.resolve_device(args.device)  # clear error when the device is absent
    import torch

    from br_serve.engine.base import SamplingParams
    from br_serve.engine.tiny_model import llama_config
    from br_serve.engine.torch_engine import TorchEngine

    batches = [int(v) for v in args.batches.split(",")]
    contexts = [int(v) for v in args.contexts.split(",")]
    shape = PRESETS[args.preset]
    cfg = llama_config(max_positions=max(contexts) + args.steps + args.warmup + 16, **shape)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    from transformers import LlamaForCausalLM

    with torch.device(dev):  # build the weights on the device: fast for 8B shapes
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    build_s = time.perf_counter() - t0
    params_n = sum(p.numel() for p in model.parameters())
    engine = TorchEngine.from_model(model, None, device=args.device, max_batch=max(batches),
                                    seed=args.seed)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    sp = SamplingParams(max_tokens=10**9, ignore_eos=True)
    points: list[dict[str, Any]] = []
    for b in batches:
        for ctx in contexts:
            for i in range(b):
                kv_shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, ctx, head_dim)
                kv = {"keys": torch.randn(kv_shape, generator=gen, device=dev, dtype=dtype),
                      "values": torch.randn(kv_shape, generator=gen, device=dev, dtype=dtype)}
                engine.admit(f"b{b}c{ctx}r{i}", kv, ctx, 1 + i % 100, sp)
            for _ in range(args.warmup):
                engine.step()
            for _ in range(args.steps):
                load = engine.load_tokens()
                devmod.synchronize(dev)
                t = time.perf_counter()
                engine.step()
                devmod.synchronize(dev)
                points.append({"batch": b, "context": ctx, "load_tokens": load,
                               "step_s": time.perf_counter() - t})
            for rid in engine.running_ids():
                engine.abort(rid)
            last = [p["step_s"] for p in points[-args.steps:]]
            print(f"B={b:>4} L={ctx:>6} load={b * ctx:>9} step_ms median="
                  f"{1e3 * sorted(last)[len(last) // 2]:.3f}", flush=True)
    result = fit([p["load_tokens"] for p in points], [p["batch"] for p in points],
                 [p["step_s"] for p in points])
    mem = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None)
    report = {"benchmark": "cuda_step_fit", "dry_run": args.dry_run,
              "config": {"device": str(dev), "dtype": args.dtype, "preset": args.preset,
                         "shape": shape, "parameters": params_n, "batches": batches,
                         "contexts": contexts, "steps": args.steps, "warmup": args.warmup,
                         "seed": args.seed, "torch": torch.__version__,
                         "device_name": (torch.cuda.get_device_name(dev)
                                         if dev.type == "cuda" else platform.processor()),
                         "host": platform.node()},
              "model_build_s": build_s, "max_memory_allocated_bytes": mem,
              "fit": result, "points": points}
    print(json.dumps({"config": report["config"], "fit": result}, indent=2))
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
