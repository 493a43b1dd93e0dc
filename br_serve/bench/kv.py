"""KV transfer throughput between two Ray actors, per transport and payload size.

A producer actor puts a torch-engine-shaped payload (``{"keys", "values"}`` fp16
tensors, ``size`` bytes in all) through the transport; a consumer actor gets it by
handle and releases it. Each (transport, size) is repeated ``reps`` times after one
warm-up; the report gives medians of put seconds, get seconds and
``MB/s = size / (put + get)`` (MB = 10^6 bytes; MiB sizes), plus get-only MB/s.
Nothing here is asserted: it measures and writes JSON.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any

MIB = 1024**2


def make_payload(size_bytes: int) -> dict[str, Any]:
    import torch

    half = size_bytes // 4  # fp16 elements per tensor: two tensors of size/2 bytes
    return {"keys": torch.full((half,), 1.0, dtype=torch.float16),
            "values": torch.full((half,), 2.0, dtype=torch.float16)}


def bench_transport(transport: str, sizes_mib: list[int], reps: int,
                    options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run one transport over all sizes (Ray must be initialised)."""
    import ray

    from br_serve.bench.workers import DecodeEndpoint, PrefillEndpoint, spawn

    prod = spawn(PrefillEndpoint, None, transport, options, num_cpus=0)
    cons = spawn(DecodeEndpoint, None, transport, options, num_cpus=0)
    rows = []
    try:
        for mib in sizes_mib:
            size = mib * MIB
            payload = ray.put(make_payload(size))
            puts, gets = [], []
            for rep in range(reps + 1):
                handle, put_s = ray.get(prod.put_payload.remote(f"bench/{mib}/{rep}", payload))
                get_s, got = ray.get(cons.pull_payload.remote(handle))
                if got != size:
                    raise RuntimeError(f"{transport}: {mib} MiB payload arrived as {got} bytes")
                if rep:  # rep 0 warms up connections and allocators
                    puts.append(put_s)
                    gets.append(get_s)
            put_m, get_m = statistics.median(puts), statistics.median(gets)
            rows.append({"transport": transport, "size_mib": mib, "reps": reps,
                         "put_s": put_m, "get_s": get_m,
                         "mb_per_s": size / (put_m + get_m) / 1e6,
                         "get_mb_per_s": size / get_m / 1e6})
            del payload
    finally:
        for actor in (prod, cons):
            ray.get(actor.close.remote())
            ray.kill(actor)
    return rows


def run_bench(transports: list[str], sizes_mib: list[int], reps: int,
              mooncake_master: str | None = None,
              ray_address: str | None = None) -> dict[str, Any]:
    """Measure all; uses the running Ray, or joins ``ray_address`` (e.g. ``"auto"``), or
    starts a local one; starts a local Mooncake master if needed and none is given."""
    import ray

    from br_serve.transport.mooncake_master import MooncakeMaster

    os.environ.setdefault("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")
    started_ray = not ray.is_initialized()
    if started_ray and ray_address:
        ray.init(address=ray_address, log_to_driver=False)
    elif started_ray:
        ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False,
                 object_store_memory=max(400, 6 * max(sizes_mib)) * MIB)
    master = None
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        for name in transports:
            options: dict[str, Any] | None = None
            if name == "mooncake":
                if mooncake_master is None:
                    master = MooncakeMaster().start()
                    mooncake_master = master.address
                seg = max(64, 2 * max(sizes_mib) + 16) * MIB
                options = {"master_address": mooncake_master, "global_segment_size": seg,
                           "local_buffer_size": 16 * MIB}
            rows += bench_transport(name, sizes_mib, reps, options)
    finally:
        if master is not None:
            master.stop()
        if started_ray:
            ray.shutdown()
    return {"benchmark": "kv_transfer",
            "config": {"transports": transports, "sizes_mib": sizes_mib, "reps": reps,
                       "mooncake_master": mooncake_master, "mooncake_protocol": "tcp",
                       "ray_zero_copy_torch": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"),
                       "host": platform.node(), "cpus": os.cpu_count()},
            "wall_s": time.perf_counter() - t0, "results": rows}


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'transport':<10}{'MiB':>6}{'put ms':>10}{'get ms':>10}{'MB/s':>10}"
             f"{'get MB/s':>10}"]
    for r in rows:
        lines.append(f"{r['transport']:<10}{r['size_mib']:>6}{1e3 * r['put_s']:>10.2f}"
                     f"{1e3 * r['get_s']:>10.2f}{r['mb_per_s']:>10.1f}"
                     f"{r['get_mb_per_s']:>10.1f}")
    return "\n".join(lines)
