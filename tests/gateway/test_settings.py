"""Settings: file < flags < GATEWAY_* environment, typed, and errors that name the setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from backend.settings import ServeSettings
from gateway.settings import BackendConfig, Settings, SettingsError, load_settings
from tests.conftest import REPO


def test_precedence_and_types(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "port: 9000\nworkers: 3\nzone: eu-1a\nregion: eu\n"
        "backends:\n  - {url: 'http://10.0.0.1:8001', region: eu, zone: eu-1a}\n"
        "  - http://b:8001@eu/eu-1b\n"
    )
    s = load_settings(cfg, {"port": 9100, "host": None}, environ={
        "GATEWAY_PORT": "9200", "GATEWAY_HEDGE": "true", "GATEWAY_REDIS_TIMEOUT_MS": "25",
        "GATEWAY_REDIS_URL": "redis://127.0.0.1:6380/0", "OTHER": "x",
    })
    assert s.port == 9200 and isinstance(s.port, int)
    assert s.workers == 3 and s.hedge is True and s.redis_timeout_ms == 25.0
    assert s.redis_url == "redis://127.0.0.1:6380/0"
    assert s.host == "127.0.0.1"
    assert s.backends == (BackendConfig(url="http://10.0.0.1:8001", region="eu", zone="eu-1a"),
                          BackendConfig(url="http://b:8001", region="eu", zone="eu-1b"))
    env = load_settings(None, None, environ={"GATEWAY_BACKENDS": "http://a:1@r/z,http://b:2"})
    assert [b.zone for b in env.backends] == ["z", "local"]


@pytest.mark.parametrize(("values", "field"), [
    ({"port": "eighty"}, "port"),
    ({"port": 70000}, "port"),
    ({"workers": -1}, "workers"),
    ({"hedge": "maybe"}, "hedge"),
    ({"redis_url": "http://x"}, "redis_url"),
    ({"backends": ["ftp://x"]}, "backends"),
    ({"tier_concurrency": 0}, "tier_concurrency"),
    ({"no_such_setting": 1}, "no_such_setting"),
    ({"log_level": "LOUD"}, "log_level"),
    ({"model_aliases": {"x": "nope"}}, "model_aliases"),
])
def test_bad_values_name_the_setting(values: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        load_settings(None, values, environ={})


def test_bad_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1, 2\n")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(bad, None, environ={})
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml", None, environ={})
    with pytest.raises(SettingsError, match="port"):
        load_settings(None, None, environ={"GATEWAY_PORT": "x"})


def test_every_setting_is_documented_in_the_readme() -> None:
    """The README's settings tables name every field, gateway and backend alike."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    gateway_missing = [f.name for f in dataclasses.fields(Settings)
                       if f"`{f.name}`" not in readme]
    backend_missing = [f.name for f in dataclasses.fields(ServeSettings)
                       if f"BACKEND_{f.name.upper()}" not in readme
                       and f"--{f.name.replace('_', '-')}" not in readme]
    assert gateway_missing == [] and backend_missing == []
