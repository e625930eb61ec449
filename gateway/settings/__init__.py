"""The gateway's settings: one typed model with a section per component, validated once.

``Settings`` (gateway/settings/model.py) holds the top level (listen address, workers, backends,
models, tokens, request limits) and the sections ``cache``, ``redis``, ``routing``,
``admission`` (with ``admission.adaptive``), ``policies`` and ``logging``. Each section is the
value object its component takes as it is: ``Router(settings.backends, settings.routing)``,
``Admission(settings.admission)``, ``RedisCache(settings.redis)``; no mapping code sits in
between, and each bound is checked once, in the section that owns the field.

``load_settings`` (gateway/settings/load.py) reads defaults < ``--config`` YAML < flags <
``GATEWAY_*`` environment, names a bad setting by its dotted path
(``admission.adaptive.buffer: must be between 0 and 10``) and points old flat names at their
new place (``l1_max_entries`` -> ``cache.max_entries``, gateway/settings/hints.py).
``settings_fields()`` (gateway/settings/fields.py) lists every setting with its dotted path,
type, default and environment variable.

Why frozen dataclasses and one generic loader rather than pydantic-settings: the sections stay
plain keyword-only value objects that tests and components build directly (as the project's
other value objects are), the environment names keep their single-underscore form
(``GATEWAY_REDIS_URL``, ``GATEWAY_ADMISSION_ADAPTIVE_BUFFER``), which pydantic-settings' nested
delimiter cannot express without ambiguity, and the loader (about 250 lines) is less than the
customisation pydantic-settings would need for these names, the dotted-path messages and the
old-name hints; it adds no dependency.
"""

from gateway.settings.fields import ENV_PREFIX, Setting, settings_fields
from gateway.settings.hints import MOVED
from gateway.settings.load import load_settings
from gateway.settings.model import LoggingSettings, PolicySettings, Settings
from gateway.validation import SettingsError

__all__ = [
    "ENV_PREFIX",
    "MOVED",
    "LoggingSettings",
    "PolicySettings",
    "Setting",
    "Settings",
    "SettingsError",
    "load_settings",
    "settings_fields",
]
