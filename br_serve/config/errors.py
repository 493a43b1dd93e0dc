"""One formatter for pydantic errors at every edge (sim, serve, predictors, CLI)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from br_serve.core.options import ConfigError

M = TypeVar("M", bound=BaseModel)


#: a validator's message that names a field below its location: ``"options.r_max: ..."``
_NAMED = re.compile(r"[A-Za-z_][\w.]*(\[\d+\])?: ")


def describe_validation_error(exc: ValidationError, owner: str = "") -> str:
    """``"[owner.]<path>: <reason> (got <value>)"`` for the first error of ``exc``.

    The path is the error's location in the tree (``policy.options.r_max``). A
    validator's message that starts with a field name relative to its location
    (``"r_max: ..."`` from the ``policy.options`` check) is joined to it; a cross-field
    check of the whole model has no location and its message names the fields, so it is
    returned as it is.
    """
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = [str(p) for p in err["loc"]]
    if owner:
        loc.insert(0, owner)
    if not loc:
        return msg
    field = ".".join(loc)
    if msg.startswith(f"{loc[-1]}: "):  # a validator that already named its field
        return ".".join([*loc[:-1], msg])
    if err["type"] == "value_error" and _NAMED.match(msg):
        return f"{field}.{msg}"
    return f"{field}: {msg} (got {err.get('input')!r})"


def validated(model: type[M], data: Mapping[str, Any], error: type[ValueError] = ConfigError,
              owner: str = "") -> M:
    """``model(**data)``, with pydantic's error turned into ``error`` naming the field."""
    try:
        return model(**data)
    except ValidationError as exc:
        raise error(describe_validation_error(exc, owner)) from None
