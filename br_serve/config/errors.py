"""One formatter for pydantic errors at every edge (sim, serve, predictors, CLI)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from br_serve.core.options import ConfigError

M = TypeVar("M", bound=BaseModel)


def describe_validation_error(exc: ValidationError, owner: str = "") -> str:
    """``"[owner.]<field>: <reason> (got <value>)"`` for the first error of ``exc``.

    A cross-field check has no location; its own message names the fields, so it is
    returned as it is.
    """
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return msg
    field = ".".join(str(p) for p in err["loc"])
    prefix = f"{owner}.{field}" if owner else field
    if msg.startswith(f"{field}: "):  # a validator that already named its field
        return f"{owner}.{msg}" if owner else msg
    return f"{prefix}: {msg} (got {err.get('input')!r})"


def validated(model: type[M], data: Mapping[str, Any], error: type[ValueError] = ConfigError,
              owner: str = "") -> M:
    """``model(**data)``, with pydantic's error turned into ``error`` naming the field."""
    try:
        return model(**data)
    except ValidationError as exc:
        raise error(describe_validation_error(exc, owner)) from None
