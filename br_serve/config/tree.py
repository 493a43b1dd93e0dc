"""The machinery of the nested configuration: sections, names, command-line flags.

A composed configuration (the graph's :class:`~br_serve.serve.config.GraphConfig`, the
simulator's :class:`~br_serve.sim.config.SimConfig`) is a frozen pydantic model whose
fields are a few top-level values and **sections**: frozen sub-models
(:class:`Section`) or core option dataclasses (:func:`options_field`, e.g. the step
model). A field's one name is its **path**, ``section.field`` (``step.b_s``,
``policy.options``, ``serve.port``). Where a dot is awkward the path is written with
``_`` (builder arguments, ``--set``, Python keywords: ``step_b_s``) or ``-`` (flags:
``--step-b-s``); :func:`nest` turns either spelling into the nested dict the model
validates, and :func:`add_flags` derives one flag per field from the tree. A section
with a ``name`` field takes a bare string for it (``policy=brh``: ``policy.name``).
Keys below an options mapping address its options (``policy.options.r_max=4``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, InstanceOf, model_validator

from br_serve.core.options import ConfigError, Options, as_dict, option_docs, parse_options

#: command-line spellings of "not given" for an optional field
_NONE = ("", "none", "null")


class Section(BaseModel):
    """A frozen sub-configuration; a docstring per field (shown by ``--help``).

    A section with a ``name`` field accepts a bare value for it: ``"brh"`` is
    ``{"name": "brh"}``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        if "name" in cls.model_fields and (data is None or isinstance(data, str)):
            if isinstance(data, str) and data.strip().lower() in _NONE:
                data = None
            return {"name": data}
        return data


def options_field(cls: type[Options]) -> Any:
    """The annotation of a section that is a core options class: loose input (a
    mapping of strings, lists) is parsed by :func:`parse_options`, an instance kept."""

    def parse(v: Any) -> Any:
        if isinstance(v, cls):
            return v
        if not isinstance(v, Mapping):
            raise ValueError(f"expected a mapping of {cls.__name__} fields")
        return parse_options(cls, v)

    return Annotated[InstanceOf[cls], BeforeValidator(parse)]  # type: ignore[valid-type,misc]


@dataclass(frozen=True, slots=True)
class Leaf:
    """One field of the tree: its path, type, default and docstring."""

    path: tuple[str, ...]
    annotation: Any
    default: Any
    doc: str

    @property
    def name(self) -> str:
        """The dotted path (``step.b_s``)."""
        return ".".join(self.path)

    @property
    def flat(self) -> str:
        """The path written with ``_`` (``step_b_s``)."""
        return "_".join(self.path)

    @property
    def flag(self) -> str:
        """The command-line flag (``--step-b-s``)."""
        return "--" + self.flat.replace("_", "-")


def _section_type(annotation: Any) -> type | None:
    """The section class a field holds (a :class:`Section` or an options class)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel | Options):
        return annotation
    return None


def _doc(text: str | None) -> str:
    return " ".join((text or "").replace("``", "").split())


def leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[Leaf]:
    """Every field of ``model``'s tree, depth first, in declaration order."""
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        sec = _section_type(info.annotation)
        if sec is not None and issubclass(sec, BaseModel):
            yield from leaves(sec, path)
        elif sec is not None and issubclass(sec, Options):
            hints = typing.get_type_hints(sec)
            for opt, _type, default, doc in option_docs(sec):
                yield Leaf((*path, opt), hints[opt], default, _doc(doc))
        else:
            default = info.get_default(call_default_factory=True)
            yield Leaf(path, info.annotation, default, _doc(info.description))


def sections(model: type[BaseModel]) -> dict[str, type]:
    """``name -> section class`` of ``model``'s sections."""
    out = {}
    for name, info in model.model_fields.items():
        sec = _section_type(info.annotation)
        if sec is not None:
            out[name] = sec
    return out


def _fields_of(sec: type) -> set[str]:
    if issubclass(sec, BaseModel):
        return set(sec.model_fields)
    return {f.name for f in dataclasses.fields(sec)}  # type: ignore[arg-type]


def check_flat_names(model: type[BaseModel]) -> None:
    """Raise ``AssertionError`` if two fields of ``model`` share a flat name (or a flat
    name could be read as another path): the spelling must stay one-to-one."""
    seen: dict[str, str] = {}
    for leaf in leaves(model):
        other = seen.setdefault(leaf.flat, leaf.name)
        assert other == leaf.name, f"{leaf.flat}: flat name of {other} and {leaf.name}"
    for top in model.model_fields:
        if top not in sections(model):
            for sec, cls in sections(model).items():
                rest = top.removeprefix(sec + "_")
                assert rest == top or rest not in _fields_of(cls), \
                    f"{top}: also the flat name of {sec}.{rest}"


def resolve(model: type[BaseModel], key: str) -> tuple[str, ...]:
    """The path a key names: dotted, a top-level field, or ``section_field``.

    An unknown key comes back as it is, for the model to refuse by name.
    """
    key = key.strip()
    if "." in key:
        return tuple(key.split("."))
    if key in model.model_fields:
        return (key,)
    for sec, cls in sections(model).items():
        rest = key.removeprefix(sec + "_")
        if rest != key and rest in _fields_of(cls):
            return (sec, rest)
    return (key,)


def _allows_none(annotation: Any) -> bool:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return type(None) in get_args(annotation)
    return annotation is None or annotation is type(None)


def _leaf_annotation(model: type[BaseModel], path: tuple[str, ...]) -> Any:
    info = model.model_fields.get(path[0])
    if info is None:
        return None
    if len(path) == 1:
        return info.annotation
    sec = _section_type(info.annotation)
    if sec is not None and issubclass(sec, BaseModel):
        return _leaf_annotation(sec, path[1:])
    if sec is not None and issubclass(sec, Options) and len(path) == 2:
        return typing.get_type_hints(sec).get(path[1])
    return None


def nest(model: type[BaseModel], data: Mapping[str, Any]) -> dict[str, Any]:
    """Loose input (dotted, flat or nested keys) -> the nested dict ``model`` validates.

    Optional fields read ``""``, ``none`` and ``null`` from a command line as None.
    """
    out: dict[str, Any] = {}
    _put_all(model, out, data)
    return out


def _put_all(model: type[BaseModel], out: dict[str, Any], data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        path = resolve(model, str(key))
        if isinstance(value, str) and value.lower() in _NONE \
                and _allows_none(_leaf_annotation(model, path)):
            value = None
        _put(model, out, path, value)


def _put(model: type[BaseModel], out: dict[str, Any], path: tuple[str, ...],
         value: Any) -> None:
    node = out
    for i, part in enumerate(path[:-1]):
        cur = node.get(part)
        if cur is None or isinstance(cur, str):
            # a bare name given before (policy=brh, then policy.options.x=1)
            cur = {} if cur is None else {"name": cur}
        elif isinstance(cur, BaseModel):
            cur = cur.model_dump()
        elif isinstance(cur, Options):
            cur = as_dict(cur)
        elif not isinstance(cur, dict):
            raise ConfigError(f"{'.'.join(path[:i + 1])}: expected a mapping "
                              f"(got {cur!r})")
        else:
            cur = dict(cur)
        node[part] = cur
        node = cur
    last = path[-1]
    cur = node.get(last)
    sec = sections(model).get(last) if len(path) == 1 else None
    if sec is not None:  # a whole section: merged into what is there, field by field
        if isinstance(cur, str):
            cur = {"name": cur}
        if isinstance(value, str) and "name" in _fields_of(sec):
            value = {"name": value}  # a bare name keeps the section's other fields
        if isinstance(value, Mapping) and isinstance(cur, dict):
            value = {**cur, **value}  # field by field; a field's own value is replaced
    node[last] = value


def as_nested(cfg: BaseModel) -> dict[str, Any]:
    """``cfg`` as a nested dict of plain values (what :func:`nest` and the model
    read back)."""
    return cfg.model_dump()


def add_flags(parser: argparse.ArgumentParser | Any, model: type[BaseModel],
              skip: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None) -> None:
    """One flag per field of ``model`` (``--step-b-s`` for ``step.b_s``) not under a
    path in ``skip``; a given flag's value lands in ``args.config`` as
    ``{path: text}`` for :func:`nest`. ``defaults`` only shows in the help text (the
    model's own default otherwise)."""
    parser.set_defaults(config=None)
    for leaf in leaves(model):
        if any(leaf.name == s or leaf.name.startswith(s + ".") for s in skip):
            continue
        default = (defaults or {}).get(leaf.name, leaf.default)
        shown = "" if default in (None, {}, ()) else f" (default: {default})"
        kw: dict[str, Any] = {"dest": f"cfg:{leaf.name}", "default": argparse.SUPPRESS,
                              "help": f"{leaf.doc}{shown}".replace("%", "%%")}
        if leaf.annotation is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["metavar"] = leaf.path[-1].upper()
        parser.add_argument(leaf.flag, **kw)


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``{path: value}`` of the config flags given on the command line."""
    return {k.removeprefix("cfg:"): v for k, v in vars(args).items() if k.startswith("cfg:")}


M = typing.TypeVar("M", bound=BaseModel)


def parse_config(model: type[M], data: Mapping[str, Any] | BaseModel | None = None,
                 error: type[ValueError] = ConfigError, **overrides: Any) -> M:
    """Validate ``data`` (a config of ``model``, or loose input in any spelling of
    :func:`nest`) with ``overrides`` applied on top, once.

    Raises:
        ``error``: ``"<path>: <reason> (got <value>)"`` for the first bad field; an
            unknown one is ``"<key>: Extra inputs are not permitted"``.
    """
    from br_serve.config.errors import validated

    if isinstance(data, model) and not overrides:
        return data
    try:
        base = data.model_dump() if isinstance(data, BaseModel) else nest(model, data or {})
        _put_all(model, base, overrides)
    except ConfigError as exc:
        raise error(str(exc)) from None
    return validated(model, base, error)
