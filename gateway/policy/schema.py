"""The JSON Schema (draft 2020-12) of policy files, as data.

``policies/schema.json`` is this dict written out for editors (a test keeps the two identical);
the loader validates with it, so the published schema and the loader can never disagree.
Regenerate the file after a change (from the repository root)::

    python -c "from gateway.policy.schema import dumps; print(dumps(), end='')" \\
        > policies/schema.json
"""

from __future__ import annotations

import json
from typing import Any

from gateway.policy.model import DETECTOR_NAMES
from gateway.policy.targets import HIDDEN_HEADERS

DURATION_PATTERN = r"^\s*([0-9]+(\.[0-9]+)?\s*(ms|s|m|h|d)\s*)+$"

_duration = {
    "type": ["number", "string"],
    "minimum": 0,
    "pattern": DURATION_PATTERN,
    "description": "a duration: seconds as a number, or a string such as 30s, 5m, 1h, 1d, 1h30m",
}
_names = {
    "type": ["string", "array"],
    "minLength": 1,
    "items": {"type": "string", "minLength": 1},
    "minItems": 1,
    "description": "a name or a list of names; fnmatch globs (*, ?, [...]) allowed",
}
_normalization = {
    "type": "object",
    "additionalProperties": False,
    "description": "How texts are canonicalised before the backend, the detectors and the key.",
    "properties": {
        "unicode_form": {"enum": ["NFC", "NFKC", "NFD", "NFKD", "none"]},
        "casefold": {"type": "boolean"},
        "whitespace": {"enum": ["collapse", "strip", "keep"]},
        "max_chars": {"type": "integer", "minimum": 1},
        "on_overflow": {"enum": ["truncate", "reject"]},
        "max_items": {"type": "integer", "minimum": 1},
    },
}
_privacy = {
    "type": "object",
    "additionalProperties": False,
    "description": "PII detectors and their action; a rule's detectors add to the defaults.",
    "properties": {
        "detectors": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                name: {"enum": ["no_store", "redact", "reject", "off"]} for name in DETECTOR_NAMES
            },
        },
    },
}
_settings: dict[str, Any] = {
    "cache": {"type": "boolean", "description": "false: never read or write the cache"},
    "scope": {"enum": ["tenant", "shared"],
              "description": "tenant: one cache per tenant; shared: one cache for all tenants"},
    "ttl": _duration,
    "stale_while_revalidate": _duration,
    "stale_if_error": _duration,
    "normalization": {"$ref": "#/$defs/normalization"},
    "privacy": {"$ref": "#/$defs/privacy"},
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:edge-gateway:cache-policy:1",
    "title": "Edge gateway cache policy",
    "description": "Rules matched in order by route, model, tenant and headers; first match wins.",
    "type": "object",
    "additionalProperties": False,
    "required": ["rules"],
    "properties": {
        "version": {"type": ["string", "number"],
                    "description": "a label; the effective version adds a content hash"},
        "description": {"type": "string"},
        "defaults": {"$ref": "#/$defs/settings"},
        "rules": {"type": "array", "items": {"$ref": "#/$defs/rule"}},
    },
    "$defs": {
        "duration": _duration,
        "names": _names,
        "normalization": _normalization,
        "privacy": _privacy,
        "settings": {"type": "object", "additionalProperties": False, "properties": _settings},
        "match": {
            "type": "object",
            "additionalProperties": False,
            "description": "All listed conditions must hold; an empty match matches everything.",
            "properties": {
                "routes": {"$ref": "#/$defs/names",
                           "description": "cached routes as rules see them (e.g. "
                                          "/v1/embeddings, /v2/models/{name}/infer) or globs "
                                          "that match one"},
                "models": {"$ref": "#/$defs/names",
                           "description": "served model names (aliases are resolved before "
                                          "rules match) or globs that match one"},
                "tenants": {"$ref": "#/$defs/names"},
                "headers": {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "integer"]},
                    "description": "header name -> exact value or glob (no operators); "
                                   f"never {', '.join(sorted(HIDDEN_HEADERS))}",
                },
            },
        },
        "rule": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$",
                         "description": "1-64 letters, digits, '.', '_', ':' or '-'"},
                "description": {"type": "string"},
                "match": {"$ref": "#/$defs/match"},
                **_settings,
            },
        },
    },
}


def dumps() -> str:
    """The schema as the text of ``policies/schema.json``."""
    return json.dumps(SCHEMA, indent=2) + "\n"
