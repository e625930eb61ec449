"""Tenants: API-key digests -> tenant ids, validated files, constant-time identify, 401s."""

from __future__ import annotations

import hmac
import textwrap
from pathlib import Path

import pytest

from gateway.errors import Unauthorized
from gateway.tenants.directory import PUBLIC, Tenants, TenantsError, key_digest

ACME_KEY = "acme-secret-key-1"
BETA_KEY = "beta-secret-key-1"


def tenants_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


@pytest.fixture
def tenants(tmp_path: Path) -> Tenants:
    return Tenants.load(tenants_file(tmp_path, f"""
        tenants:
          acme:
            description: ACME Corp
            api_keys_sha256: ["{key_digest(ACME_KEY)}", "{key_digest('acme-old-key').upper()}"]
          beta:
            api_keys_sha256: ["{key_digest(BETA_KEY)}"]
    """))


def test_identify_maps_keys_to_tenants(tenants: Tenants) -> None:
    assert tenants.configured
    assert tenants.names == {"acme", "beta"}
    assert tenants.identify(f"Bearer {ACME_KEY}") == "acme"
    assert tenants.identify("Bearer acme-old-key") == "acme"  # digests match case-insensitively
    assert tenants.identify(f"bearer   {BETA_KEY} ") == "beta"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", f"Basic {ACME_KEY}", ACME_KEY])
def test_missing_key_is_401(tenants: Tenants, header: str | None) -> None:
    with pytest.raises(Unauthorized) as info:
        tenants.identify(header)
    assert info.value.status == 401
    assert info.value.headers() == {"WWW-Authenticate": 'Bearer realm="gateway"'}


def test_unknown_key_is_401_and_never_echoed(tenants: Tenants) -> None:
    with pytest.raises(Unauthorized) as info:
        tenants.identify("Bearer not-a-known-key")
    assert "not-a-known-key" not in info.value.message


def test_a_key_of_bytes_that_are_not_utf8_is_401(tenants: Tenants) -> None:
    """aiohttp keeps undecodable header bytes as surrogates; digesting them raised (a 500)."""
    with pytest.raises(Unauthorized) as info:
        tenants.identify("Bearer \udcff\udcfe-key")
    assert info.value.message == "unknown API key"


def test_without_a_file_everyone_is_public() -> None:
    public = Tenants.public()
    assert not public.configured
    assert public.names == {PUBLIC}
    assert public.identify(None) == PUBLIC
    assert public.identify("Bearer anything") == PUBLIC


def test_every_stored_digest_is_compared_no_early_exit(
    tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The one place a spy is needed: timing cannot be asserted, the comparisons can.
    calls: list[str] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr("gateway.tenants.directory.hmac.compare_digest", spy)
    assert tenants.identify(f"Bearer {ACME_KEY}") == "acme"  # the first stored digest
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(Unauthorized):
        tenants.identify("Bearer unknown")
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("tenants:\n  acme:\n    api_keys_sha256: [abc]\n",
         ":3: tenants.acme.api_keys_sha256[0]: not a SHA-256 digest (64 hex characters)"),
        (f"tenants:\n  '':\n    api_keys_sha256: ['{'a' * 64}']\n",
         ":2: tenants.: tenant id '': use 1-64 letters"),
        (f"tenants:\n  shared:\n    api_keys_sha256: ['{'a' * 64}']\n",
         ":2: tenants.shared: 'shared' is reserved"),
        ("tenants:\n  acme: {}\n", ":2: tenants.acme: expected 'api_keys_sha256'"),
        (f"tenants:\n  acme:\n    api_keys_sha256: ['{'a' * 64}']\n    keys: []\n",
         ":4: tenants.acme.keys: unknown field"),
        ("tenant:\n  acme: {}\n", ": (document): expected a mapping with a 'tenants' mapping"),
        ("tenants: [\n", "YAML syntax error"),
    ],
)
def test_invalid_files_name_file_line_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = tenants_file(tmp_path, body)
    with pytest.raises(TenantsError) as info:
        Tenants.load(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_a_key_shared_by_two_tenants_names_both(tmp_path: Path) -> None:
    digest = key_digest("shared-key")
    path = tenants_file(tmp_path, f"""
        tenants:
          acme:
            api_keys_sha256: ["{digest}"]
          beta:
            api_keys_sha256: ["{digest.upper()}"]
    """)
    with pytest.raises(TenantsError) as info:
        Tenants.load(path)
    assert (f"{path}:5: tenants.beta.api_keys_sha256[0]: key already belongs to tenant 'acme'"
            in str(info.value))


def test_names_that_yaml_1_1_would_turn_into_booleans_stay_names(tmp_path: Path) -> None:
    path = tenants_file(tmp_path, f"tenants:\n  no:\n    api_keys_sha256: ['{'b' * 64}']\n")
    assert Tenants.load(path).names == {"no"}


def test_from_mapping_validates_like_a_file() -> None:
    tenants = Tenants.from_mapping({"acme": [key_digest(ACME_KEY)]})
    assert tenants.identify(f"Bearer {ACME_KEY}") == "acme"
    with pytest.raises(TenantsError, match="not a SHA-256 digest"):
        Tenants.from_mapping({"acme": ["short"]})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TenantsError, match="cannot read"):
        Tenants.load(tmp_path / "missing.yaml")
