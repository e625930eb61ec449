"""The model's shape: every setting's dotted path, type, default and environment variable.

Walks ``Settings`` and its section dataclasses by type hints (a field whose type is a dataclass
is a section), so the loader, the hints and the tests enumerate the same list.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, get_type_hints

from gateway.settings.model import Settings

ENV_PREFIX = "GATEWAY_"


@dataclass(frozen=True)
class Setting:
    """One leaf of the model: its dotted path, its type and its default."""

    path: str
    hint: Any
    default: object

    @property
    def env(self) -> str:
        """Its environment variable."""
        return ENV_PREFIX + self.path.replace(".", "_").upper()


def is_section(hint: object) -> bool:
    """True for a field type that is a section (or a value object such as a backend)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def hints_of(cls: type) -> dict[str, Any]:
    """A dataclass's init fields and their resolved types."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def sections() -> tuple[str, ...]:
    """Every section's dotted path (``redis``, ``admission.adaptive``...)."""
    found: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, hint in hints_of(cls).items():
            if is_section(hint):
                found.append(prefix + name)
                walk(hint, f"{prefix}{name}.")

    walk(Settings, "")
    return tuple(found)


@functools.cache
def settings_fields() -> tuple[Setting, ...]:
    """Every setting of the model, in declaration order, sections' fields in place."""
    found: list[Setting] = []

    def walk(cls: type, default: object, prefix: str) -> None:
        for name, hint in hints_of(cls).items():
            value = getattr(default, name)
            if is_section(hint):
                walk(hint, value, f"{prefix}{name}.")
            else:
                found.append(Setting(prefix + name, hint, value))

    walk(Settings, Settings(), "")
    return tuple(found)
