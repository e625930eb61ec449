"""Schema checks on parsed JSON bodies, shared by the route adapters (pure: no I/O).

Each failure is a ``ValidationFailed`` (422) that names the field and says what to send.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import ValidationFailed


def require_str(data: dict[str, Any], field: str, *, allow_empty: bool = False) -> str:
    value = data.get(field)
    if value is None:
        raise ValidationFailed(field, "is required")
    if not isinstance(value, str):
        raise ValidationFailed(field, f"must be a string, not {type(value).__name__}")
    if not allow_empty and not value:
        raise ValidationFailed(field, "must not be empty")
    return value


def text_list(value: Any, field: str, *, allow_single: bool = True) -> list[str]:
    """A string or a non-empty list of strings (each checked, with its index in the message)."""
    if isinstance(value, str) and allow_single:
        return [value]
    if value is None:
        raise ValidationFailed(field, "is required")
    if not isinstance(value, list):
        kinds = "a string or a list of strings" if allow_single else "a list of strings"
        raise ValidationFailed(field, f"must be {kinds}")
    if not value:
        raise ValidationFailed(field, "must not be empty")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            if isinstance(item, int) or (isinstance(item, list) and item
                                         and isinstance(item[0], int)):
                raise ValidationFailed(f"{field}[{i}]",
                                       "token arrays are not supported; send text")
            raise ValidationFailed(f"{field}[{i}]", f"must be a string, not {type(item).__name__}")
    return value


def check_keys(data: dict[str, Any], allowed: set[str]) -> None:
    """Unknown fields are a 422, so a typo never silently changes behaviour."""
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValidationFailed(unknown[0], f"unknown field (allowed: {', '.join(sorted(allowed))})")


def whole(value: Any) -> int | None:
    """``value`` as an int when JSON Schema counts it an integer (``3`` and ``3.0``, not ``true``
    or ``3.5``), else None: a client that serialises every number as a float is not refused."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():  # is_integer(): False for inf and nan
        return int(value)
    return None


def positive_int(data: dict[str, Any], field: str, default: int, *, upper: int | None = None,
                 ) -> int:
    """An optional integer field >= 1 (and <= ``upper``)."""
    value = whole(data.get(field, default))
    if value is None or value < 1 or (upper is not None and value > upper):
        bound = f"from 1 to {upper}" if upper is not None else "of at least 1"
        raise ValidationFailed(field, f"must be an integer {bound}")
    return value
