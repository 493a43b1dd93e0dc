"""``br-serve emulate-engine``: a protocol-faithful stand-in for a vLLM or SGLang server.

Examples (a 1P1D pair on one machine, 8 decode ranks behind one port)::

    br-serve emulate-engine --protocol vllm --role prefill --dp-size 1 --port 8100
    br-serve emulate-engine --protocol vllm --role decode --dp-size 8 --port 8200 \\
        --step-a-s-per-token 5e-7 --step-b-s 0.03

The decode role finds its prefill twin through the transfer parameters themselves
(vLLM ``remote_host``/``remote_port``, SGLang ``bootstrap_host``/``bootstrap_port``),
so the two are started independently. See docs/engine-contracts.md.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}"
                                         ) from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "emulate-engine", help="serve an emulated vLLM / SGLang prefill or decode engine",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", required=True, choices=("vllm", "sglang"))
    p.add_argument("--role", required=True, choices=("prefill", "decode"))
    p.add_argument("--dp-size", type=int, default=1, help="data-parallel ranks (G)")
    p.add_argument("--port", type=int, required=True, help="HTTP port (rank 0's with "
                                                           "--port-per-rank)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port-per-rank", action="store_true",
                   help="vllm: one API server per rank on port+g (external DP)")
    p.add_argument("--advertise-host", default=None,
                   help="host written into transfer parameters (default: --host)")
    p.add_argument("--bootstrap-port", type=int, default=None,
                   help="sglang prefill: extra port serving the KV bootstrap")
    p.add_argument("--model", default="emulated", help="served model name")
    p.add_argument("--step-a-s-per-token", type=_floats, default=(5e-7,),
                   help="step model a (s per token of load), one value or one per rank")
    p.add_argument("--step-b-s", type=_floats, default=(0.03,),
                   help="step model b (s), one value or one per rank")
    p.add_argument("--slots", type=int, default=256, help="most running requests per rank")
    p.add_argument("--kv-limit-tokens", type=int, default=1_000_000,
                   help="KV tokens per rank (denominator of the usage gauges)")
    p.add_argument("--prefill-p0-s", type=float, default=0.0,
                   help="prefill seconds per prompt, independent of its length")
    p.add_argument("--prefill-p1-s-per-token", type=float, default=0.0,
                   help="prefill seconds per prompt token")
    p.add_argument("--kv-ttl-s", type=float, default=None,
                   help="prefill: release unpulled KV after this (vllm 480, sglang 300)")
    p.add_argument("--bootstrap-wait-s", type=float, default=None,
                   help="decode: wait this long for the KV to appear (vllm 0, sglang 300)")
    p.add_argument("--twin-timeout-s", type=float, default=5.0)
    p.add_argument("--api-key", default=os.environ.get("BR_EMULATOR_API_KEY"),
                   help="require this bearer key (default $BR_EMULATOR_API_KEY)")
    fields = p.add_mutually_exclusive_group()
    fields.add_argument("--strict-fields", action="store_true",
                        help="refuse (400, naming it) a request field the emulator does "
                             "not model; default: accept, log at debug level and count it "
                             "in /emulator/stats, as vLLM and SGLang do")
    fields.add_argument("--allow-unknown-fields", action="store_true",
                        help="accept unknown request fields (the default; kept so older "
                             "command lines still run)")
    p.add_argument("--enable-fault-injection", action="store_true",
                   help="serve POST /emulator/fault to drop or stall a rank")
    p.add_argument("--engine-id", default=None)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--kv-store-dir", default=None,
                   help="vllm: a prompt-keyed KV connector on this shared directory (as "
                        "vLLM's ExampleConnector): prefill answers kv_transfer_params null, "
                        "decode takes requests without them")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace) -> Any:
    from br_serve.emulator.config import EmulatorConfig

    return EmulatorConfig(
        protocol=args.protocol, role=args.role, dp_size=args.dp_size, port=args.port,
        host=args.host, port_per_rank=args.port_per_rank, advertise_host=args.advertise_host,
        bootstrap_port=args.bootstrap_port, model=args.model,
        step_a_s_per_token=args.step_a_s_per_token, step_b_s=args.step_b_s,
        slots=args.slots, kv_limit_tokens=args.kv_limit_tokens,
        prefill_p0_s=args.prefill_p0_s,
        prefill_p1_s_per_token=args.prefill_p1_s_per_token,
        kv_ttl_s=args.kv_ttl_s, bootstrap_wait_s=args.bootstrap_wait_s,
        twin_timeout_s=args.twin_timeout_s, api_key=args.api_key,
        strict_fields=args.strict_fields,
        enable_fault_injection=args.enable_fault_injection, engine_id=args.engine_id,
        block_size=args.block_size, kv_store_dir=args.kv_store_dir)


def _run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # ValueError -> "br-serve emulate-engine: error: ..."
    from br_serve.emulator.server import serve

    def ready(_: object) -> None:
        urls = [f"http://{cfg.public_host}:{p}" for p in cfg.ports()]
        print(json.dumps({"ready": True, "protocol": cfg.protocol, "role": cfg.role,
                          "dp_size": cfg.dp_size, "urls": urls}), flush=True)

    serve(cfg, args.log_level, ready)
    return 0
