"""One generic registry for every pluggable family (policies, predictors, engines, ...).

A family is a :class:`Registry` with a name (used in error messages as the field name,
e.g. ``"policy: unknown 'x'; known: ..."``) and, optionally, the package holding its
built-ins. Built-ins register themselves with the ``register`` decorator when their
module is imported; the registry imports every module of that package the first time
it is asked for a name, so adding a built-in is adding one file.

A name with a dot is a qualified name, ``"package.module.Attr"``: the module is
imported (it may register itself) and ``Attr`` is registered under the qualified
name if it is not yet. That is how a user plugs in a part without editing this
package (the module must be importable wherever the part runs, e.g. on Ray workers).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Generic, TypeVar

from br_serve.core.options import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """``name -> T`` for one family; see the module docstring."""

    def __init__(self, family: str, builtins: str | None = None) -> None:
        self.family = family
        self._builtins = builtins
        self._loaded = builtins is None
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make ``name`` resolve to the decorated object.

        Raises:
            ValueError: ``name`` is taken, or contains a dot (reserved for qualified names).
        """

        def deco(obj: T) -> T:
            if "." in name:
                raise ValueError(f"{self.family} name {name!r}: dots are reserved for "
                                 "qualified names")
            self._add(name, obj)
            return obj

        return deco

    def _add(self, name: str, obj: T) -> None:
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.family} {name!r} registered twice")
        self._items[name] = obj

    def names(self) -> frozenset[str]:
        """Every name registered so far (built-ins included)."""
        self._load_builtins()
        return frozenset(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.names() or self._qualified(name))

    def get(self, name: str) -> T:
        """The object registered as ``name`` (a qualified name is imported).

        Raises:
            ConfigError: ``"<family>: unknown '<name>'; known: ..."``, or why a qualified
                name could not be imported.
        """
        self._load_builtins()
        if name in self._items:
            return self._items[name]
        if "." in name:
            self._import_qualified(name)
            return self._items[name]
        known = ", ".join(sorted(self._items))
        raise ConfigError(f"{self.family}: unknown {name!r}; known: {known} "
                          "(or a qualified name, package.module.Name)")

    def _qualified(self, name: str) -> bool:
        if "." not in name:
            return False
        try:
            self._import_qualified(name)
        except ConfigError:
            return False
        return True

    def _import_qualified(self, name: str) -> None:
        if name in self._items:
            return
        module, _, attr = name.rpartition(".")
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"{self.family}: cannot import {module!r} for {name!r}: "
                              f"{exc}") from None
        obj = getattr(mod, attr, None)
        if obj is None:
            raise ConfigError(f"{self.family}: module {module!r} has no {attr!r}")
        self._add(name, obj)

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        assert self._builtins is not None
        pkg = importlib.import_module(self._builtins)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self._builtins}.{info.name}")
