"""``br-serve`` command line: one entry point, subcommands contributed by modules.

Each module in :data:`COMMAND_MODULES` exposes ``register(subparsers)``, which adds its
subcommands and sets ``func`` (a callable taking the parsed namespace and returning an
exit code). Modules must keep heavy imports (ray, torch) inside their functions so
that ``br-serve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "br_serve.policies_cli",  # policies
    "br_serve.bench.tick",  # bench-tick
    "br_serve.sim.cli",  # sim, fetch-trace
    "br_serve.sim.capacity_cli",  # capacity
    "predictors.cli",  # train-predictor, eval-predictor
    "br_serve.serve.cli",  # serve / demo
    "br_serve.bench.cli",  # bench-serve / bench-kv / bench-control-plane / bench-peers
    "br_serve.emulator.cli",  # emulate-engine
    "br_serve.config.reference",  # config-reference
)


#: top-level modules of the optional extras -> the extra that installs them
EXTRA_OF = {"ray": "serve", "fastapi": "serve", "httpx": "serve", "msgpack": "serve",
            "safetensors": "serve", "torch": "serve", "starlette": "serve",
            "uvicorn": "serve", "transformers": "torch", "torch_npu": "npu",
            "mooncake": "mooncake"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """``"needs the serve extra: pip install 'br-serve[serve]'"`` when ``exc`` is a
    module of an optional extra that is not installed, else None."""
    top = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    return f"needs the {extra} extra: pip install 'br-serve[{extra}]'"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="br-serve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod_name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name and mod_name.startswith(exc.name):
                continue  # that part of the product is not installed in this checkout
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: a one-line message naming the problem, no traceback.
        print(f"br-serve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        why = missing_extra(exc)
        if why is None:
            raise
        print(f"br-serve {args.command}: {why}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
