"""KV transfer throughput (MB/s) of the object-ref and Mooncake transports.

Same as ``br-serve bench-kv`` (see :mod:`br_serve.bench.kv`); kept here so the
benchmarks folder lists it. Example:

    RAY_AUTH_MODE=disabled python benchmarks/kv_transfer.py --sizes-mib 1,16,64 --reps 5 \\
        --out kv_transfer.json
"""

from __future__ import annotations

import sys

from br_serve.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench-kv", *sys.argv[1:]]))
