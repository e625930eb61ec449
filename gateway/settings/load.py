"""Loading ``Settings``: defaults < ``--config`` YAML < flags < ``GATEWAY_*`` environment.

One generic loader walks the model (``Settings`` and its section dataclasses) by type hints, so
a field added to a section is settable from the file, the flags' overrides and the environment
with nothing else to write:

- **YAML and overrides** are nested mappings (``redis: {url: ...}``); dotted keys
  (``{"redis.url": ...}``) mean the same and merge with them. A later source replaces a value,
  never a whole section. Unknown keys are refused with a hint (gateway/settings/hints.py): an
  old flat name (``l1_max_entries``) names its new place (``cache.max_entries``), a typo its
  closest setting.
- **Environment**: ``GATEWAY_`` + the dotted path in capitals, dots as underscores
  (``GATEWAY_PORT``, ``GATEWAY_REDIS_URL``, ``GATEWAY_ADMISSION_ADAPTIVE_BUFFER``). Lists are
  comma-separated (``GATEWAY_BACKENDS=http://a:8001@eu/eu-1a,http://b:8001``), mappings
  ``KEY=VALUE,...``. An old flat name (``GATEWAY_TIER_CONCURRENCY``) or an unknown name in a
  section's namespace (``GATEWAY_REDIS_*``) is refused; other ``GATEWAY_*`` variables are not
  the gateway's and are ignored.
- **Values** from text (env, flags) are parsed to the field's type here; bounds are checked by
  each section's ``__post_init__`` only, and any ``SettingsError`` is re-raised with the
  section's dotted path in front: ``admission.adaptive.buffer: must be between 0 and 10``.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml

from gateway.settings.fields import ENV_PREFIX, hints_of, is_section, sections, settings_fields
from gateway.settings.hints import MOVED, env_suggestion, suggestion
from gateway.settings.model import Settings
from gateway.validation import SettingsError


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Settings from the defaults, the YAML file, ``overrides`` (the flags: nested mappings or
    dotted keys; None values are skipped), then ``environ`` (``os.environ`` by default)."""
    raw: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        _merge(raw, _read_config(path), Settings, "", f" (in {path})")
    _merge(raw, {k: v for k, v in (overrides or {}).items() if v is not None}, Settings, "", "")
    _merge(raw, _from_env(os.environ if environ is None else environ), Settings, "", "")
    built: Settings = _build(Settings, raw, "")
    return built


def _read_config(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise SettingsError(f"config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"config: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config: {path} must hold a mapping of settings")
    return data


def _from_env(environ: Mapping[str, str]) -> dict[str, str]:
    by_name = {s.env: s.path for s in settings_fields()}
    namespaces = tuple(f"{ENV_PREFIX}{s.replace('.', '_').upper()}_" for s in sections())
    found: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        if name in by_name:
            found[by_name[name]] = value
        elif name.removeprefix(ENV_PREFIX).lower() in MOVED or name.startswith(namespaces):
            # An old flat name, or a name in a section's namespace: the gateway's, and wrong.
            raise SettingsError(f"{name}: {env_suggestion(name, list(by_name))}")
    return found


def _unknown(path: str, origin: str) -> SettingsError:
    hint = suggestion(path)
    where = f"; did you mean {hint}?" if hint else " (README.md lists every setting)"
    return SettingsError(f"{path}: unknown setting{origin}{where}")


def _merge(into: dict[str, Any], values: Mapping[Any, Any], cls: type, prefix: str,
           origin: str) -> None:
    """Merge ``values`` (nested mappings and dotted keys) into ``into``, refusing unknown keys."""
    known = hints_of(cls)
    for key, value in values.items():
        head, dot, rest = str(key).partition(".")
        hint = known.get(head)
        if hint is None:
            raise _unknown(prefix + head, origin)
        if is_section(hint):
            sub = {rest: value} if dot else ({} if value is None else value)
            if not isinstance(sub, Mapping):
                raise _not_a_section(prefix + head, hint, origin)
            _merge(into.setdefault(head, {}), sub, hint, f"{prefix}{head}.", origin)
        elif dot:
            raise _unknown(prefix + str(key), origin)
        else:
            into[head] = value


def _not_a_section(path: str, cls: type, origin: str) -> SettingsError:
    names = ", ".join(hints_of(cls))
    moved = f"; did you mean {MOVED[path]}?" if path in MOVED else ""
    return SettingsError(f"{path}: is a section{origin}: give a mapping of its settings "
                         f"({names}){moved}")


def _build(cls: type, raw: Mapping[str, Any], prefix: str) -> Any:
    hints = hints_of(cls)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        hint = hints[name]
        path = prefix + name
        values[name] = (_build(hint, value, path + ".") if is_section(hint)
                        else _coerce(path, value, hint))
    try:
        return cls(**values)
    except ValueError as exc:  # SettingsError, or a section's own ValueError naming its field
        raise SettingsError(f"{prefix}{exc}") from None


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _coerce(path: str, value: object, hint: Any) -> object:
    """``value`` (from YAML, a flag or the environment) as the type ``hint`` says."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        (inner,) = (a for a in args if a is not type(None))
        if value is None or (value == "" and inner is not str):
            return None
        return _coerce(path, value, inner)
    if value is None:
        raise SettingsError(f"{path}: a value is required")
    if origin is tuple:
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(
            value, str) else value
        if not isinstance(items, list | tuple):
            raise SettingsError(f"{path}: must be a list (got {value!r})")
        return tuple(_item(f"{path}[{i}]", v, args[0]) for i, v in enumerate(items))
    if origin is Mapping:
        pairs = _pairs(path, value) if isinstance(value, str) else value
        if not isinstance(pairs, Mapping):
            raise SettingsError(f"{path}: must be a mapping (got {value!r})")
        return {str(k): _coerce(f"{path}.{k}", v, args[1]) for k, v in pairs.items()}
    return _scalar(path, value, hint)


def _scalar(path: str, value: object, hint: Any) -> object:
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise SettingsError(f"{path}: {value!r} is not a boolean (true or false)")
    try:
        if hint in (int, float) and isinstance(value, str) and not value.isascii():
            raise ValueError  # int() and float() would read "٣" as 3
        if hint is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)  # type: ignore[call-overload]
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)  # type: ignore[arg-type]
        if hint is str:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        kind = {int: "an integer", float: "a number", str: "a string"}[hint]
        raise SettingsError(f"{path}: {value!r} is not {kind}") from None
    raise TypeError(f"{path}: the loader has no rule for {hint!r}")


def _pairs(path: str, text: str) -> dict[str, str]:
    """``KEY=VALUE,KEY=VALUE`` (a mapping given as text)."""
    pairs: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SettingsError(f"{path}: {item!r} is not KEY=VALUE")
        pairs[key.strip()] = value.strip()
    return pairs


def _item(path: str, value: object, hint: Any) -> object:
    """One list item: a scalar, or a value object (a mapping of its fields, or its compact text
    form through its ``parse`` classmethod)."""
    if not is_section(hint):
        return _coerce(path, value, hint)
    if isinstance(value, hint):
        return value
    try:
        if isinstance(value, str):
            return hint.parse(value)
    except ValueError as exc:
        raise SettingsError(f"{path}.{exc}") from None
    if not isinstance(value, Mapping):
        raise SettingsError(f"{path}: must be a mapping or text (got {value!r})")
    unknown = sorted(str(k) for k in value if k not in hints_of(hint))
    if unknown:
        raise SettingsError(f"{path}: unknown key(s) {', '.join(unknown)} "
                            f"(each takes {', '.join(hints_of(hint))})")
    return _build(hint, value, f"{path}.")
