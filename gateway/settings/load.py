"""Loading ``Settings``: defaults < ``--config`` YAML < flags < ``GATEWAY_*`` environment.

One generic loader walks the model (``Settings`` and its section dataclasses) by type hints, so
a field added to a section is settable from the file, the flags' overrides and the environment
with nothing else to write:

- **YAML and overrides** are nested mappings (``redis: {url: ...}``); dotted keys
  (``{"redis.url": ...}``) mean the same and merge with them. A later source replaces a value,
  never a whole section. Unknown keys are refused with a hint: an old flat name
  (``l1_max_entries``) names its new place (``cache.max_entries``), a typo its closest setting.
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

import dataclasses
import difflib
import functools
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from gateway.settings.model import Settings
from gateway.validation import SettingsError

ENV_PREFIX = "GATEWAY_"

#: The flat names of the model before it had sections, and where each setting is now.
MOVED = {
    "region": "routing.region", "zone": "routing.zone",
    "redis_url": "redis.url", "redis_cluster": "redis.cluster",
    "redis_timeout_ms": "redis.timeout_s", "redis_key_prefix": "redis.key_prefix",
    "l1_max_entries": "cache.max_entries", "l1_max_bytes": "cache.max_bytes",
    "policies": "policies.path", "shadow_policies": "policies.shadow_path",
    "policy_poll_s": "policies.poll_interval_s",
    "connect_timeout_ms": "routing.connect_timeout_s", "read_timeout_ms": "routing.read_timeout_s",
    "pool_size": "routing.pool_size", "health_interval_s": "routing.health_interval_s",
    "eject_after_failures": "routing.eject_after_failures", "hedge": "routing.hedge_after_p95",
    "tier_concurrency": "admission.tier_concurrency", "tier_queue": "admission.tier_queue",
    "adaptive_concurrency": "admission.adaptive.enabled",
    "adaptive_window_ms": "admission.adaptive.window_s",
    "adaptive_percentile": "admission.adaptive.percentile",
    "adaptive_buffer": "admission.adaptive.buffer",
    "adaptive_min_limit": "admission.adaptive.min_limit",
    "adaptive_probe_interval_s": "admission.adaptive.probe_interval_s",
    "adaptive_probe_requests": "admission.adaptive.probe_requests",
    "log_level": "logging.level", "log_request_text": "logging.request_text",
}
_NOW_SECONDS = {"redis_timeout_ms", "connect_timeout_ms", "read_timeout_ms", "adaptive_window_ms"}


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


def _is_section(hint: object) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def sections() -> tuple[str, ...]:
    """Every section's dotted path (``redis``, ``admission.adaptive``...)."""
    found: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, hint in _hints(cls).items():
            if _is_section(hint):
                found.append(prefix + name)
                walk(hint, f"{prefix}{name}.")

    walk(Settings, "")
    return tuple(found)


@functools.cache
def settings_fields() -> tuple[Setting, ...]:
    """Every setting of the model, in declaration order, sections' fields in place."""
    found: list[Setting] = []

    def walk(cls: type, default: object, prefix: str) -> None:
        for name, hint in _hints(cls).items():
            value = getattr(default, name)
            if _is_section(hint):
                walk(hint, value, f"{prefix}{name}.")
            else:
                found.append(Setting(prefix + name, hint, value))

    walk(Settings, Settings(), "")
    return tuple(found)


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
            continue
        old = name.removeprefix(ENV_PREFIX).lower()
        if old in MOVED:
            new = MOVED[old]
            raise SettingsError(f"{name}: this setting is now {new}{_unit(old)}: set "
                                f"{Setting(new, None, None).env} instead")
        if name.startswith(namespaces):
            close = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.7)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise SettingsError(f"{name}: no such setting{hint}")
    return found


def _unit(old: str) -> str:
    return " (in seconds)" if old in _NOW_SECONDS else ""


def _suggestion(path: str) -> str | None:
    """Where a setting named ``path`` probably is: its new place, or the closest name."""
    if path in MOVED:
        return MOVED[path] + _unit(path)
    leaf = path.rsplit(".", 1)[-1]
    same = [s.path for s in settings_fields() if s.path.rsplit(".", 1)[-1] == leaf]
    if same:
        return " or ".join(same)
    names = [s.path for s in settings_fields()] + list(sections())
    close = difflib.get_close_matches(path, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown(path: str, origin: str) -> SettingsError:
    hint = _suggestion(path)
    where = f"; did you mean {hint}?" if hint else " (README.md lists every setting)"
    return SettingsError(f"{path}: unknown setting{origin}{where}")


def _merge(into: dict[str, Any], values: Mapping[Any, Any], cls: type, prefix: str,
           origin: str) -> None:
    """Merge ``values`` (nested mappings and dotted keys) into ``into``, refusing unknown keys."""
    known = _hints(cls)
    for key, value in values.items():
        head, dot, rest = str(key).partition(".")
        hint = known.get(head)
        if hint is None:
            raise _unknown(prefix + head, origin)
        if _is_section(hint):
            sub = {rest: value} if dot else ({} if value is None else value)
            if not isinstance(sub, Mapping):
                raise _not_a_section(prefix + head, hint, origin)
            _merge(into.setdefault(head, {}), sub, hint, f"{prefix}{head}.", origin)
        elif dot:
            raise _unknown(prefix + str(key), origin)
        else:
            into[head] = value


def _not_a_section(path: str, cls: type, origin: str) -> SettingsError:
    names = ", ".join(_hints(cls))
    moved = f"; did you mean {MOVED[path]}?" if path in MOVED else ""
    return SettingsError(f"{path}: is a section{origin}: give a mapping of its settings "
                         f"({names}){moved}")


def _build(cls: type, raw: Mapping[str, Any], prefix: str) -> Any:
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        hint = hints[name]
        path = prefix + name
        values[name] = (_build(hint, value, path + ".") if _is_section(hint)
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
    if not _is_section(hint):
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
    unknown = sorted(str(k) for k in value if k not in _hints(hint))
    if unknown:
        raise SettingsError(f"{path}: unknown key(s) {', '.join(unknown)} "
                            f"(each takes {', '.join(_hints(hint))})")
    return _build(hint, value, f"{path}.")
