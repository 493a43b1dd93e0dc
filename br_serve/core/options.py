"""Frozen option dataclasses for pluggable parts, validated when they are built.

Every pluggable family (policies, predictors, ...) declares its options as a frozen,
slotted dataclass deriving from :class:`Options`, one field per option made with
:func:`option` (default, bounds, a docstring). Building one validates every field, so
an options object that exists is valid; :func:`parse_options` is the edge that turns
loose input (command-line strings, YAML, JSON) into one.

Errors are :class:`ConfigError` whose message starts with the field's name, in the same
form as the pydantic edges (``"r_max: Input should be greater than or equal to 1
(got 0)"``), so every layer reports bad input alike. Pure: no pydantic here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin


class ConfigError(ValueError):
    """Invalid configuration; the message starts with the name of the bad field."""


_BOUNDS: tuple[tuple[str, Callable[[float, float], bool], str], ...] = (
    ("ge", lambda v, b: v >= b, "greater than or equal to"),
    ("gt", lambda v, b: v > b, "greater than"),
    ("le", lambda v, b: v <= b, "less than or equal to"),
    ("lt", lambda v, b: v < b, "less than"))


def option(default: Any, *, doc: str, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None) -> Any:
    """A dataclass field with a default, numeric bounds and a one-line docstring."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt}
    return dataclasses.field(default=default, metadata=meta)


class Options:
    """Base of every options dataclass: validates the fields after construction.

    Subclasses are ``@dataclass(frozen=True, slots=True)``; they may override
    :meth:`check` for cross-field rules (raise :class:`ConfigError` naming the fields).
    """

    __slots__ = ()

    def __post_init__(self) -> None:
        for f, hint in _fields(type(self)):
            _check_value(f, hint, getattr(self, f.name))
        self.check()

    def check(self) -> None:
        """Cross-field validation hook (none by default)."""

    def replace(self: OptT, **changes: Any) -> OptT:
        """A validated copy with ``changes`` applied (strings are coerced)."""
        return parse_options(type(self), {**as_dict(self), **changes})


OptT = TypeVar("OptT", bound=Options)


@dataclasses.dataclass(frozen=True, slots=True)
class NoOptions(Options):
    """For parts that take no options."""


def as_dict(opts: Options) -> dict[str, Any]:
    """The options as a plain ``{name: value}`` dict (round-trips through parse)."""
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}  # type: ignore[arg-type]


def option_docs(cls: type[Options]) -> list[tuple[str, str, Any, str]]:
    """``(name, type, default, doc)`` of every option of ``cls`` (for help and docs)."""
    out = []
    for f, hint in _fields(cls):
        out.append((f.name, _type_name(hint), f.default, str(f.metadata.get("doc", ""))))
    return out


def parse_options(cls: type[OptT], data: Mapping[str, Any] | Options | None = None,
                  owner: str = "") -> OptT:
    """Build ``cls`` from loose input, coercing strings to each field's type.

    ``owner`` prefixes the field in messages (``"brh.horizon: ..."``). An instance of
    ``cls`` is returned as it is.

    Raises:
        ConfigError: an unknown key (listing the known ones) or a bad value, named.
    """
    if isinstance(data, cls):
        return data
    if isinstance(data, Options):
        data = as_dict(data)
    raw = dict(data or {})
    fields = dict((f.name, (f, hint)) for f, hint in _fields(cls))
    prefix = f"{owner}." if owner else ""
    for key in raw:
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"{prefix}{key}: Extra inputs are not permitted "
                              f"(known options: {known})")
    vals = {}
    for key, value in raw.items():
        vals[key] = _coerce(prefix + key, fields[key][1], value)
    try:
        return cls(**vals)
    except ConfigError as exc:
        raise ConfigError(prefix + str(exc)) from None


# -- internals ---------------------------------------------------------------------------
_HINTS: dict[type, list[tuple[dataclasses.Field[Any], Any]]] = {}


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    got = _HINTS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = [(f, hints[f.name]) for f in dataclasses.fields(cls)]
        _HINTS[cls] = got
    return got


def _alternatives(hint: Any) -> tuple[Any, ...]:
    if get_origin(hint) in (typing.Union, types.UnionType):
        return get_args(hint)
    return (hint,)


def _type_name(hint: Any) -> str:
    names = []
    for h in _alternatives(hint):
        if h is type(None):
            names.append("None")
        elif get_origin(h) is Literal:
            names.append("|".join(repr(a) for a in get_args(h)))
        elif get_origin(h) is tuple:
            names.append(f"{get_args(h)[0].__name__} list")
        else:
            names.append(getattr(h, "__name__", str(h)))
    return " | ".join(names)


def _fail(name: str, msg: str, value: Any) -> ConfigError:
    return ConfigError(f"{name}: {msg} (got {value!r})")


def _check_value(f: dataclasses.Field[Any], hint: Any, value: Any) -> None:
    alts = _alternatives(hint)
    if value is None:
        if type(None) not in alts:
            raise _fail(f.name, f"Input should be {_type_name(hint)}", value)
        return
    for h in alts:
        if _matches(h, value):
            break
    else:
        raise _fail(f.name, f"Input should be {_type_name(hint)}", value)
    items = value if isinstance(value, tuple) else (value,)
    for key, ok, words in _BOUNDS:
        bound = f.metadata.get(key)
        if bound is None:
            continue
        for v in items:
            if isinstance(v, int | float) and not ok(v, bound):
                raise _fail(f.name, f"Input should be {words} {bound}", value)


def _matches(hint: Any, value: Any) -> bool:
    if hint is type(None):
        return value is None
    if get_origin(hint) is Literal:
        return value in get_args(hint)
    if get_origin(hint) is tuple:
        (elem, _dots) = get_args(hint)
        return isinstance(value, tuple) and all(_matches(elem, v) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, hint)


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null", ""}


def _coerce(name: str, hint: Any, value: Any) -> Any:
    """Loose input -> the field's type: strings from command lines, lists from YAML."""
    alts = _alternatives(hint)
    for h in alts:  # a nested options class (e.g. a predictor's fallback's options)
        if isinstance(h, type) and issubclass(h, Options) and isinstance(value, Mapping):
            return parse_options(h, value, owner=name)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _NONE and type(None) in alts:
            return None
        for h in alts:
            got = _from_str(h, value.strip())
            if got is not _NO:
                return got
        raise _fail(name, f"Input should be {_type_name(hint)}", value)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, int) and not isinstance(value, bool) and float in alts \
            and int not in alts:
        return float(value)
    return value


_NO = object()


def _from_str(hint: Any, text: str) -> Any:
    try:
        if hint is bool:
            low = text.lower()
            return True if low in _TRUE else False if low in _FALSE else _NO
        if hint is int:
            return int(text)
        if hint is float:
            return float(text)
        if hint is str:
            return text
        if get_origin(hint) is Literal:
            return text if text in get_args(hint) else _NO
        if get_origin(hint) is tuple:
            elem = get_args(hint)[0]
            parts = [_from_str(elem, p.strip()) for p in text.split(",") if p.strip()]
            return _NO if not parts or _NO in parts else tuple(parts)
    except ValueError:
        return _NO
    return _NO
