"""Tenants: the exact words a client or an operator reads (401 bodies, file errors).

These are contract, not decoration: a client's error handling and an operator's fix both read
them. Written to kill the mutants ``make mutate`` found surviving in gateway/tenants/directory.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.errors import Unauthorized
from gateway.tenants.directory import PUBLIC, Tenants, TenantsError, key_digest


def load(tmp_path: Path, text: str) -> Tenants:
    path = tmp_path / "tenants.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return Tenants.load(path)


def test_no_tenants_file_is_one_public_tenant() -> None:
    public = Tenants.public()
    assert public.keys == () and public.configured is False
    assert public.names == {PUBLIC}
    assert public.identify(None) == PUBLIC and public.identify("Bearer anything") == PUBLIC


def test_the_401_messages_say_what_to_send() -> None:
    tenants = Tenants.from_mapping({"acme": [key_digest("k-1")]})
    with pytest.raises(Unauthorized) as missing:
        tenants.identify(None)
    assert str(missing.value) == "missing API key: send 'Authorization: Bearer <key>'"
    with pytest.raises(Unauthorized) as unknown:
        tenants.identify("Bearer k-2")
    assert str(unknown.value) == "unknown API key"
    assert tenants.identify("Bearer k-1") == "acme"


def test_mapping_errors_name_the_mapping_and_the_field() -> None:
    with pytest.raises(TenantsError) as err:
        Tenants.from_mapping({"bad id!": [], "acme": ["nothex"]})
    assert str(err.value).splitlines() == [
        "<mapping>: tenants.bad id!: tenant id 'bad id!': use 1-64 letters, digits, '.', '_' "
        "or '-'",
        "<mapping>: tenants.acme.api_keys_sha256[0]: not a SHA-256 digest (64 hex characters)",
    ]


def test_a_file_that_is_not_a_mapping_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(TenantsError) as err:
        load(tmp_path, "- just\n- a list\n")
    assert str(err.value) == (f"{tmp_path / 'tenants.yaml'}:1: (document): expected a mapping with "
                              "a 'tenants' mapping of tenant id -> keys")


def test_unknown_top_level_fields_are_named_with_their_line(tmp_path: Path) -> None:
    with pytest.raises(TenantsError) as err:
        load(tmp_path, f"""
            tenants:
              acme:
                api_keys_sha256: ["{key_digest('k')}"]
            tennants: {{}}
        """)
    assert str(err.value) == (f"{tmp_path / 'tenants.yaml'}:4: tennants: unknown field; "
                              "allowed: tenants, defaults")


def test_every_problem_of_a_file_is_listed_with_its_line(tmp_path: Path) -> None:
    digest = key_digest("k")
    with pytest.raises(TenantsError) as err:
        load(tmp_path, f"""
            defaults: 3
            tenants:
              shared:
                api_keys_sha256: []
              bad id:
                api_keys_sha256: []
              nokeys: {{}}
              acme:
                api_keys_sha256: ["{digest}", "{digest}", "xyz"]
              beta:
                api_keys_sha256: ["{digest}"]
        """)
    name = tmp_path / "tenants.yaml"
    assert str(err.value).splitlines() == [
        f"{name}:1: defaults: expected a mapping of weight, priority, quota",
        f"{name}:3: tenants.shared: 'shared' is reserved (the shared cache scope)",
        f"{name}:5: tenants.bad id: tenant id 'bad id': use 1-64 letters, digits, '.', '_' or '-'",
        f"{name}:7: tenants.nokeys: expected 'api_keys_sha256': a list of SHA-256 hex digests",
        f"{name}:9: tenants.acme.api_keys_sha256[1]: duplicate key",
        f"{name}:9: tenants.acme.api_keys_sha256[2]: not a SHA-256 digest (64 hex characters)",
        f"{name}:11: tenants.beta.api_keys_sha256[0]: key already belongs to tenant 'acme'",
    ]


def test_the_defaults_apply_to_every_tenant(tmp_path: Path) -> None:
    tenants = load(tmp_path, f"""
        defaults:
          weight: 3
        tenants:
          acme:
            api_keys_sha256: ["{key_digest('k')}"]
    """)
    assert tenants.default.weight == 3
    assert tenants.spec("acme").weight == 3 and tenants.spec("unknown").weight == 3


def test_unreadable_and_malformed_files_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_bytes("tenants: {acme: {api_keys_sha256: ['\u00e9']}}".encode("latin-1"))
    with pytest.raises(TenantsError) as err:
        Tenants.load(path)
    assert str(err.value).startswith(f"{path}: cannot read: ")
    path.write_text("tenants: [unclosed\n", encoding="utf-8")
    with pytest.raises(TenantsError) as err:
        Tenants.load(path)
    assert str(err.value).startswith(f"{path}:")
    assert "\n" not in str(err.value) and ":?:" not in str(err.value)


def test_every_duplicate_key_of_a_file_is_listed_on_its_own_line(tmp_path: Path) -> None:
    with pytest.raises(TenantsError) as err:
        load(tmp_path, """
            tenants:
              a: {api_keys_sha256: []}
              a: {api_keys_sha256: []}
              b: {api_keys_sha256: []}
              b: {api_keys_sha256: []}
        """)
    name = tmp_path / "tenants.yaml"
    assert str(err.value).splitlines() == [
        f"{name}:3: tenants.a: duplicate key (first at line 2)",
        f"{name}:5: tenants.b: duplicate key (first at line 4)",
    ]


def test_a_control_character_is_refused_with_its_line_not_a_crash(tmp_path: Path) -> None:
    # PyYAML's reader refuses it before parsing (ReaderError, unmarked): it used to escape as
    # that exception instead of a TenantsError naming the file and line.
    with pytest.raises(TenantsError) as err:
        load(tmp_path, "tenants:\n  acme:\n    api_keys_sha256: [\"a\x07\"]\n")
    assert str(err.value) == (f"{tmp_path / 'tenants.yaml'}:3: (document): character U+0007 is "
                              "not allowed in a YAML file: remove it")


def test_every_bad_digest_of_a_tenant_and_a_scalar_tenant_are_listed(tmp_path: Path) -> None:
    with pytest.raises(TenantsError) as err:
        load(tmp_path, """
            tenants:
              acme:
                api_keys_sha256: ["x", "y"]
              scalar: 3
        """)
    name = tmp_path / "tenants.yaml"
    assert str(err.value).splitlines() == [
        f"{name}:3: tenants.acme.api_keys_sha256[0]: not a SHA-256 digest (64 hex characters)",
        f"{name}:3: tenants.acme.api_keys_sha256[1]: not a SHA-256 digest (64 hex characters)",
        f"{name}:4: tenants.scalar: expected 'api_keys_sha256': a list of SHA-256 hex digests",
    ]


def test_the_file_is_read_as_utf_8_whatever_the_locale(tmp_path: Path) -> None:
    # A container with LANG=C and UTF-8 mode off reads files as ASCII by default; a tenants file
    # with a non-ASCII comment must still load there.
    path = tmp_path / "tenants.yaml"
    digest = key_digest("k")
    path.write_text(f"# équipe données\ntenants:\n  acme: {{api_keys_sha256: [\"{digest}\"]}}\n",
                    encoding="utf-8")
    assert Tenants.load(path).spec("acme") is not None  # here, under the test's own locale
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0"}
    code = ("import locale, sys; from pathlib import Path; "
            "from gateway.tenants.directory import Tenants; "
            "print(locale.getpreferredencoding(False)); "
            "print(Tenants.load(Path(sys.argv[1])).spec('acme') is not None)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env, cwd=Path.cwd(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    encoding, loaded = out.stdout.split()
    assert encoding.lower() not in ("utf-8", "utf8"), "the child must run with a non-UTF-8 locale"
    assert loaded == "True"
