"""``br-serve bench-kv``: KV transfer throughput of the object-ref and Mooncake transports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench-kv", help="measure KV transfer MB/s between two Ray actors per transport",
        description=__doc__)
    p.add_argument("--transports", default="objref,mooncake",
                   help="comma-separated: objref, mooncake (default both)")
    p.add_argument("--sizes-mib", default="1,16,64", help="payload sizes in MiB")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size")
    p.add_argument("--mooncake-master", default=None,
                   help="host:port of a running mooncake_master (default: start one)")
    p.add_argument("--ray-address", default=None,
                   help="join a running cluster (e.g. auto); default: start a local Ray")
    p.add_argument("--out", default="kv_transfer.json", help="JSON report path")
    p.set_defaults(func=_bench_kv)


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise ValueError(f"--sizes-mib: not a list of integers: {text!r}") from exc
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes-mib: need sizes >= 1, got {text!r}")
    return sizes


def _bench_kv(args: argparse.Namespace) -> int:
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in ("objref", "mooncake")]
    if bad or not transports:
        raise ValueError(f"--transports: unknown {bad or transports}; known: objref, mooncake")
    if args.reps < 1:
        raise ValueError("--reps: must be >= 1")
    sizes = _parse_sizes(args.sizes_mib)
    from br_serve.engine.kv_bench import format_rows, run_bench

    report = run_bench(transports, sizes, args.reps, args.mooncake_master, args.ray_address)
    print(json.dumps(report["config"]))
    print(format_rows(report["results"]))
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0
