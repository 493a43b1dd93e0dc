"""``br-serve policies [--json]``: every registered policy with its options.

One row per option: name, type, default and its one-line doc (from the options
dataclass the policy declares, so the listing cannot drift from what is accepted).
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def policy_listing() -> list[dict[str, Any]]:
    """``[{name, doc, options: [{name, type, default, doc}]}]`` sorted by name."""
    from br_serve.core.options import option_docs
    from br_serve.core.policy import policy_class, policy_names

    out = []
    for name in sorted(policy_names()):
        cls = policy_class(name)
        opts = [{"name": n, "type": t, "default": d, "doc": h}
                for n, t, d, h in option_docs(cls.Options)]
        out.append({"name": name, "doc": _one_line(cls), "options": opts})
    return out


def _one_line(cls: type) -> str:
    """The first sentence of the class's docstring, else of its module's."""
    import sys

    for doc in (cls.__doc__, getattr(sys.modules.get(cls.__module__), "__doc__", None)):
        text = " ".join((doc or "").split())
        if text and not text.startswith("See the module"):
            return text.split(". ")[0].rstrip(".") + "."
    return ""


def _text(rows: list[dict[str, Any]]) -> str:
    lines = []
    for p in rows:
        lines.append(f"{p['name']}: {p['doc']} ({len(p['options'])} options)")
        for o in p["options"]:
            lines.append(f"  {o['name']} ({o['type']}, default {o['default']!r}): {o['doc']}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    rows = policy_listing()
    print(json.dumps(rows, indent=2) if args.json else _text(rows))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("policies", help="list every registered policy with its options, "
                       "defaults and one-line docs")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_run)
