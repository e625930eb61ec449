"""``SettingsError`` and the checks every settings section validates its fields with.

Each check raises ``SettingsError("<field>: <what to fix> (got <value>)")``. A section calls them
from ``__post_init__`` with its own field names; the settings loader, which builds the sections
from the config file, flags and environment, puts the section's dotted path in front
(``admission.adaptive.buffer: must be between 0 and 10 (got 11)``). A bound is checked in one
place only: the section that owns the field.

This module imports nothing from the gateway, so the sections that live beside their components
(``gateway/cache/settings.py``, ``gateway/routing/config.py``...) can all use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeGuard


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names it and says what to fix."""


def _number(value: object) -> TypeGuard[float]:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def positive(name: str, value: object, *, upper: float | None = None) -> None:
    """A finite number > 0 (and <= ``upper`` when given)."""
    if not _number(value) or value <= 0:
        raise SettingsError(f"{name}: must be a finite number > 0 (got {value!r})")
    if upper is not None and value > upper:
        raise SettingsError(f"{name}: must be at most {upper:g} (got {value!r})")


def between(name: str, value: object, low: float, high: float, *,
            open_low: bool = False) -> None:
    """A number in [low, high], or (low, high] with ``open_low``."""
    if (not _number(value) or value > high
            or (value <= low if open_low else value < low)):
        lowest = f"above {low:g}" if open_low else f"{low:g}"
        raise SettingsError(f"{name}: must be between {lowest} and {high:g} (got {value!r})")


def at_least(name: str, value: object, low: int) -> None:
    """An integer >= ``low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise SettingsError(f"{name}: must be an integer >= {low} (got {value!r})")


def boolean(name: str, value: object) -> None:
    """``True`` or ``False`` (not a string that looks like one)."""
    if not isinstance(value, bool):
        raise SettingsError(f"{name}: must be true or false (got {value!r})")


def label(name: str, value: object) -> None:
    """A non-empty string that is not only whitespace."""
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{name}: must be a non-empty string (got {value!r})")


def one_of(name: str, value: object, choices: Iterable[str]) -> None:
    """One of ``choices`` (compared as given)."""
    options = list(choices)
    if value not in options:
        raise SettingsError(f"{name}: must be one of {', '.join(options)} (got {value!r})")


def token(name: str, value: str | None, unset: str) -> None:
    """None, or printable ASCII without spaces (an HTTP bearer token); ``unset`` says what
    leaving it unset means."""
    if value is None:
        return
    if not (isinstance(value, str) and value and value.isascii() and value.isprintable()
            and " " not in value):
        raise SettingsError(f"{name}: must be non-empty printable ASCII without spaces "
                            f"(leave it unset {unset})")
