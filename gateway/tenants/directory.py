"""Tenants: which API key belongs to which tenant id (the cache scope), and each tenant's quota,
fair-share weight and priority class.

The tenants file stores only SHA-256 digests of the keys, never the keys::

    defaults:                          # optional: what a tenant has unless it says otherwise
      quota: {requests_per_s: 20, texts_per_s: 200, texts_per_day: 1000000}
    tenants:
      acme:
        api_keys_sha256: ["<64 hex chars>", "..."]
        weight: 2                      # optional: share of a busy backend tier
        priority: interactive          # optional: or batch
        quota: {texts_per_s: 500}      # optional: key by key over the defaults

The quota, weight and priority fields are described in gateway/tenants/quota/spec.py; the file is
reloaded while the gateway runs (gateway/tenants/store.py).

A request names its key as ``Authorization: Bearer <key>``. ``identify`` hashes the presented key
and compares it with every stored digest in constant time (``hmac.compare_digest``, no early
exit), so response timing says nothing about which digest was close. With a tenants file a
missing or unknown key is 401; without one (``Tenants.public()``) every request is tenant
``public``. Keys are never logged, and errors never echo them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import Unauthorized
from gateway.policy.model import SHARED_SCOPE
from gateway.policy.yamlpos import field_path, parse
from gateway.tenants.quota.spec import SPEC_FIELDS, TenantSpec, parse_spec

PUBLIC = "public"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_TENANT_FIELDS = ("api_keys_sha256", "description", *SPEC_FIELDS)
_ALLOWED = f"unknown field; allowed: {', '.join(_TENANT_FIELDS)}"
_TOP_FIELDS = ("tenants", "defaults")


def key_digest(key: str) -> str:
    """The SHA-256 hex digest of an API key, as the tenants file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class TenantsError(ValueError):
    """An invalid tenants file; the message lists every problem as ``file:line: field: why``."""


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


@dataclass(frozen=True, slots=True)
class Tenants:
    """API-key digests and the tenant each belongs to."""

    keys: tuple[tuple[str, str], ...]
    """(lowercase SHA-256 hex digest, tenant id) pairs."""
    configured: bool
    """False: no tenants file, every request is tenant ``public``."""
    specs: Mapping[str, TenantSpec] = field(default_factory=dict)
    """Quota, weight and priority per tenant id (defaults merged in)."""
    default: TenantSpec = field(default_factory=TenantSpec)
    """The file's ``defaults`` (what ``public`` has without a file: no limits, weight 1)."""

    @classmethod
    def public(cls) -> Tenants:
        """No tenants file: one tenant, ``public``, no authentication."""
        return cls(keys=(), configured=False)

    def spec(self, tenant: str) -> TenantSpec:
        """The tenant's quota, weight and priority (the defaults for an id not in the file)."""
        return self.specs.get(tenant, self.default)

    @property
    def names(self) -> frozenset[str]:
        """The tenant ids (``{"public"}`` without a tenants file)."""
        return frozenset(t for _, t in self.keys) if self.configured else frozenset({PUBLIC})

    @classmethod
    def load(cls, path: Path) -> Tenants:
        """Read and validate a tenants file; ``TenantsError`` names file, line and field."""
        name = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TenantsError(f"{name}: cannot read: {exc}") from None
        doc, problems = parse(text)
        if doc is None:
            raise TenantsError("\n".join(f"{name}:{ln or '?'}: {f}: {m}" for ln, f, m in problems))
        return cls._validate(doc.data, name, doc.line)

    @classmethod
    def from_mapping(cls, tenants: Mapping[str, list[str]]) -> Tenants:
        """Tenants from ``{tenant: [digest, ...]}``, validated like a file (tests, set-ups)."""
        data = {"tenants": {t: {"api_keys_sha256": list(d)} for t, d in tenants.items()}}
        return cls._validate(data, "<mapping>", lambda _path, key=False: None)

    @classmethod
    def _validate(cls, data: Any, source: str, line: Callable[..., int | None]) -> Tenants:
        problems: list[str] = []

        def problem(path: list[str | int], message: str, *, key: bool = True) -> None:
            at = line(path, key=key)
            where = f"{source}:{at}" if at is not None else source
            problems.append(f"{where}: {field_path(path)}: {message}")

        tenants = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(tenants, dict):
            problem([], "expected a mapping with a 'tenants' mapping of tenant id -> keys")
            raise TenantsError("\n".join(problems))
        for extra in (k for k in data if k not in _TOP_FIELDS):
            problem([extra], f"unknown field; allowed: {', '.join(_TOP_FIELDS)}")
        default = TenantSpec()
        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            problem(["defaults"], "expected a mapping of weight, priority, quota")
        else:
            for extra in (k for k in defaults if k not in SPEC_FIELDS):
                problem(["defaults", str(extra)],
                        f"unknown field; allowed: {', '.join(SPEC_FIELDS)}")
            default = parse_spec(defaults, ["defaults"], default, problem)
        owner: dict[str, str] = {}
        keys: list[tuple[str, str]] = []
        specs: dict[str, TenantSpec] = {}
        for tenant, spec in tenants.items():
            where: list[str | int] = ["tenants", str(tenant)]
            if not isinstance(tenant, str) or not _NAME.match(tenant):
                problem(where, f"tenant id {tenant!r}: use 1-64 letters, digits, '.', '_' or '-'")
                continue
            if tenant == SHARED_SCOPE:
                problem(where, f"{SHARED_SCOPE!r} is reserved (the shared cache scope)")
                continue
            digests = spec.get("api_keys_sha256") if isinstance(spec, dict) else None
            if not isinstance(digests, list):
                problem(where, "expected 'api_keys_sha256': a list of SHA-256 hex digests")
                continue
            for extra in (k for k in spec if k not in _TENANT_FIELDS):
                problem([*where, str(extra)], _ALLOWED)
            specs[tenant] = parse_spec(spec, where, default, problem)
            for i, digest in enumerate(digests):
                at = [*where, "api_keys_sha256", i]
                if not isinstance(digest, str) or not _HEX64.match(digest):
                    problem(at, "not a SHA-256 digest (64 hex characters)", key=False)
                    continue
                digest = digest.lower()
                if digest in owner:
                    other = owner[digest]
                    problem(at, f"key already belongs to tenant {other!r}" if other != tenant
                            else "duplicate key", key=False)
                    continue
                owner[digest] = tenant
                keys.append((digest, tenant))
        if problems:
            raise TenantsError("\n".join(problems))
        return cls(keys=tuple(keys), configured=True, specs=specs, default=default)

    def identify(self, authorization: str | None) -> str:
        """The tenant an ``Authorization`` header's key belongs to; ``Unauthorized`` if none."""
        if not self.configured:
            return PUBLIC
        key = _bearer(authorization)
        if key is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        try:
            digest = key_digest(key)
        except UnicodeEncodeError:  # bytes that are not UTF-8 (aiohttp keeps them as
            raise Unauthorized("unknown API key") from None  # surrogates): no key has them
        found: str | None = None
        for stored, tenant in self.keys:  # every digest, always: no early exit
            if hmac.compare_digest(digest, stored):
                found = tenant
        if found is None:
            raise Unauthorized("unknown API key")
        return found
