"""Settings: defaults < YAML < flags < GATEWAY_* environment, nested sections, typed values, and
errors that name the setting by its dotted path (old flat names pointed at their new place)."""

from __future__ import annotations

import dataclasses
import operator
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from backend.settings import ServeSettings
from gateway.__main__ import build_parser
from gateway.routing.config import BackendSpec
from gateway.server import flag_overrides
from gateway.settings import (
    MOVED,
    Setting,
    Settings,
    SettingsError,
    load_settings,
    settings_fields,
)
from tests.conftest import REPO
from tests.gateway.conftest import gateway_env

PATHS = {s.path for s in settings_fields()}
SECTIONS = ("cache", "cache.node", "cache.trace", "redis", "routing", "admission",
            "admission.adaptive", "quotas", "policies", "logging", "batch", "connections")


def value_at(settings: Settings, path: str) -> Any:
    return operator.attrgetter(path)(settings)


def nested(path: str, value: object) -> dict[str, Any]:
    """``"a.b.c", v`` -> ``{"a": {"b": {"c": v}}}``, as a YAML file holds it."""
    for part in reversed(path.split(".")):
        value = {part: value}
    assert isinstance(value, dict)
    return value


def test_precedence_and_types(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "port: 9000\nworkers: 3\n"
        "routing: {zone: eu-1a, region: eu}\n"
        "redis: {timeout_s: 0.5, key_prefix: 'gw:v2'}\n"
        "admission:\n  tier_concurrency: 8\n"
        "backends:\n  - {url: 'http://10.0.0.1:8001', region: eu, zone: eu-1a}\n"
        "  - http://b:8001@eu/eu-1b\n"
    )
    s = load_settings(cfg, {"port": 9100, "host": None, "admission.tier_queue": 3,
                            "routing": {"zone": "eu-1b"}}, environ={
        "GATEWAY_PORT": "9200", "GATEWAY_ROUTING_HEDGE_AFTER_P95": "true",
        "GATEWAY_REDIS_TIMEOUT_S": "0.025", "GATEWAY_REDIS_URL": "redis://127.0.0.1:6380/0",
        "OTHER": "x", "GATEWAY_ARGS": "--workers 2",  # not a setting: not the loader's
    })
    assert s.port == 9200 and isinstance(s.port, int)  # env > flags > file
    assert s.workers == 3 and s.routing.hedge_after_p95 is True
    assert s.redis.timeout_s == 0.025 and s.redis.key_prefix == "gw:v2"
    assert s.redis.url == "redis://127.0.0.1:6380/0"
    assert (s.routing.region, s.routing.zone) == ("eu", "eu-1b")  # a value, not the section
    assert (s.admission.tier_concurrency, s.admission.tier_queue) == (8, 3)
    assert s.host == "127.0.0.1"  # a flag left out (None) does not override
    assert s.backends == (BackendSpec(url="http://10.0.0.1:8001", region="eu", zone="eu-1a"),
                          BackendSpec(url="http://b:8001", region="eu", zone="eu-1b"))
    env = load_settings(None, None, environ={"GATEWAY_BACKENDS": "http://a:1@r/z,http://b:2"})
    assert [b.zone for b in env.backends] == ["z", "local"]


def test_dotted_keys_and_nested_mappings_mean_the_same() -> None:
    url = "redis://h:1/0"
    dotted = load_settings(None, {"redis.url": url, "admission.adaptive.enabled": False},
                           environ={})
    nest = load_settings(None, {"redis": {"url": url}, "admission": {"adaptive": {
        "enabled": False}}}, environ={})
    assert dotted == nest and dotted.redis.url == url and not dotted.admission.adaptive.enabled
    # An empty section in YAML (``redis:`` with everything under it commented out) is defaults.
    assert load_settings(None, {"redis": None}, environ={}).redis.url is None


def test_defaults_and_direct_construction() -> None:
    s = Settings()
    assert s.models == ("minilm",) and s.redis.url is None and s.admission.adaptive.enabled
    assert Settings(models=["a", "b"], model_aliases={}).models == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=r"^models: "):
        Settings(models="minilm")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=r"^models: "):
        Settings(models=("",), model_aliases={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]
    assert "secret-token" not in repr(Settings(admin_token="secret-token",
                                               metrics_token="secret-token"))


@pytest.mark.parametrize(("values", "message"), [
    ({"port": "eighty"}, r"port: 'eighty' is not an integer"),
    ({"port": 70000}, r"port: must be a TCP port"),
    ({"workers": -1}, r"workers: must be an integer >= 0"),
    ({"routing": {"hedge_after_p95": "maybe"}}, r"routing\.hedge_after_p95: 'maybe' is not a bool"),
    ({"redis.url": "http://x"}, r"redis\.url: the scheme must be one of"),
    ({"redis": {"failure_threshold": 0}}, r"redis\.failure_threshold: must be an integer >= 1"),
    ({"backends": ["ftp://x"]}, r"backends\[0\]\.url: must look like http://host:port"),
    ({"backends": [{"url": "http://a:1", "port": 2}]}, r"backends\[0\]: unknown key\(s\) port"),
    ({"admission": {"tier_concurrency": 0}}, r"admission\.tier_concurrency: must be an integer"),
    ({"admission.adaptive.buffer": 11}, r"admission\.adaptive\.buffer: must be between 0 and 10"),
    ({"admission.adaptive.percentile": 0},
     r"admission\.adaptive\.percentile: must be between above 0 and 100"),
    ({"routing": {"base_ejection_s": 10, "max_ejection_s": 5}},
     r"routing\.max_ejection_s: must be >= base_ejection_s"),
    ({"cache.max_entries": 0}, r"cache\.max_entries: must be an integer >= 1"),
    ({"policies.poll_interval_s": 0}, r"policies\.poll_interval_s: must be a finite number > 0"),
    ({"logging": {"level": "LOUD"}}, r"logging\.level: must be one of DEBUG, INFO"),
    ({"model_aliases": {"x": "nope"}}, r"model_aliases: 'x' points at unknown model 'nope'"),
    ({"default_timeout_ms": 70_000}, r"default_timeout_ms: must be at most max_timeout_ms"),
    ({"no_such_setting": 1}, r"no_such_setting: unknown setting"),
])
def test_bad_values_name_the_setting_by_its_path(values: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=f"^{message}"):
        load_settings(None, values, environ={})


@pytest.mark.parametrize(("values", "hint"), [
    ({"l1_max_entries": 10}, "cache.max_entries"),
    ({"tier_concurrency": 4}, "admission.tier_concurrency"),
    ({"redis_url": "redis://h:1"}, "redis.url"),
    ({"redis_timeout_ms": 50}, "redis.timeout_s (in seconds)"),
    ({"adaptive_concurrency": True}, "admission.adaptive.enabled"),
    ({"hedge": True}, "routing.hedge_after_p95"),
    ({"log_level": "DEBUG"}, "logging.level"),
    ({"policies": "/etc/policies"}, "policies.path"),  # a section now: the hint still says where
    ({"redis": {"urll": "redis://h:1"}}, "redis.url"),  # a typo: the closest name
    ({"routing": {"tier_queue": 1}}, "admission.tier_queue"),  # the same name, another section
    ({"admision": {"tier_queue": 1}}, "admission"),
])
def test_unknown_and_old_names_say_where_the_setting_is(values: dict[str, object],
                                                         hint: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(None, values, environ={})
    assert str(caught.value).endswith(f"did you mean {hint}?"), caught.value


def test_old_names_in_a_config_file_name_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "old.yaml"
    cfg.write_text("l1_max_entries: 10\n")
    with pytest.raises(SettingsError, match=rf"^l1_max_entries: unknown setting \(in {cfg}\); "
                                            r"did you mean cache\.max_entries\?$"):
        load_settings(cfg, None, environ={})


def test_every_old_flat_name_has_a_real_new_place() -> None:
    """The hint table points at settings that exist, and each old name is refused from the
    file and from the environment with its new name."""
    for old, new in MOVED.items():
        assert new in PATHS, f"{old} -> {new}: no such setting"
        with pytest.raises(SettingsError, match=rf"did you mean {new}\b"):
            load_settings(None, {old: 1}, environ={})
        env_name = "GATEWAY_" + old.upper()
        if env_name == Setting(new, None, None).env:
            continue  # the same variable as before (GATEWAY_REDIS_URL): it still works
        with pytest.raises(SettingsError, match=rf"^{env_name}: .*set "
                                                rf"{Setting(new, None, None).env} instead"):
            load_settings(None, None, environ={env_name: "1"})


def test_environment_names() -> None:
    envs = [s.env for s in settings_fields()]
    assert len(envs) == len(set(envs)), "two settings share an environment variable"
    for s in settings_fields():
        assert s.env == "GATEWAY_" + s.path.upper().replace(".", "_")
    # Deploy files and users rely on these names: they must not move.
    assert {"GATEWAY_PORT", "GATEWAY_BACKENDS", "GATEWAY_ADMIN_TOKEN", "GATEWAY_METRICS_TOKEN",
            "GATEWAY_REDIS_URL", "GATEWAY_REDIS_CLUSTER"} <= set(envs)
    assert "GATEWAY_ADMISSION_ADAPTIVE_BUFFER" in envs
    # A name in a section's namespace that is no setting is a mistake, not someone else's.
    with pytest.raises(SettingsError, match=r"^GATEWAY_REDIS_URI: no such setting; "
                                            r"did you mean GATEWAY_REDIS_URL\?"):
        load_settings(None, None, environ={"GATEWAY_REDIS_URI": "redis://h:1"})


def sample(setting: Setting) -> tuple[object, object, str]:
    """A valid value other than the default: (as loaded, as YAML holds it, as env text)."""
    hint, default, leaf = setting.hint, setting.default, setting.path.rsplit(".", 1)[-1]
    special: dict[str, tuple[object, object, str]] = {
        "backends": ((BackendSpec(url="http://b1:8001", region="eu", zone="eu-1a"),),
                     [{"url": "http://b1:8001", "region": "eu", "zone": "eu-1a"}],
                     "http://b1:8001@eu/eu-1a"),
        "models": (("minilm", "other"), ["minilm", "other"], "minilm,other"),
        "model_aliases": ({"ada": "minilm"}, {"ada": "minilm"}, "ada=minilm"),
        "quotas.hit_cost": (0.5, 0.5, "0.5"),  # the default 0 doubled is still 0
        "quotas.local_fraction": (0.5, 0.5, "0.5"),  # at most 1
        "redis.url": ("redis://cache.example:6380/2",) * 2 + ("redis://cache.example:6380/2",),
        "batch.redis_url": ("redis://batch.example:6379/1",) * 3,
        "logging.level": ("DEBUG", "DEBUG", "debug"),
        "logging.access_log": ("sampled", "sampled", "sampled"),
        "routing.retry_on": (("5xx", "reset"), ["5xx", "reset"], "5xx,reset"),
        "routing.retriable_status_codes": ((502, 504), [502, 504], "502,504"),
        "routing.http_client": ("aiohttp", "aiohttp", "aiohttp"),
        "cache.node.eviction": ("generations", "generations", "generations"),
    }
    if setting.path in special:
        return special[setting.path]
    if hint is bool:
        return (not default, not default, str(not default).lower())
    if hint in (int, int | None):
        value: object = 7 if default is None else int(default) + 1  # type: ignore[call-overload]
        return (value, value, str(value))
    if hint is float:
        value = float(default) * 2  # type: ignore[arg-type]
        return (value, value, repr(value))
    if hint in (str, str | None):
        value = f"x-{leaf}"
        return (value, value, value)
    raise AssertionError(f"{setting.path}: no sample for {hint!r}; add one to this test")


def test_every_setting_is_settable_from_the_file_and_the_environment(tmp_path: Path) -> None:
    fields = settings_fields()
    assert {s.path.rsplit(".", 1)[0] for s in fields if "." in s.path} == set(SECTIONS)
    for setting in fields:
        expected, in_yaml, in_env = sample(setting)
        assert expected != setting.default, setting.path
        cfg = tmp_path / "one.yaml"
        cfg.write_text(yaml.safe_dump(nested(setting.path, in_yaml)))
        from_file = load_settings(cfg, None, environ={})
        assert value_at(from_file, setting.path) == expected, setting.path
        from_env = load_settings(None, None, environ={setting.env: in_env})
        assert value_at(from_env, setting.path) == expected, setting.env


def test_optional_values_from_the_environment() -> None:
    s = load_settings(None, None, environ={"GATEWAY_ROUTING_MAX_INFLIGHT_PER_BACKEND": "",
                                           "GATEWAY_ADMIN_TOKEN": ""})
    assert s.routing.max_inflight_per_backend is None  # empty: unset
    assert s.admin_token == ""  # compose passes an empty token for "no admin API"


def test_flags_set_settings_by_their_dotted_names() -> None:
    args = build_parser().parse_args([
        "serve", "--redis", "redis://h:1/0", "--policies", "p/", "--shadow-policies", "s.yaml",
        "--region", "eu", "--zone", "eu-1a", "--log-level", "debug", "--backend", "http://b:1",
        "--port", "9000"])
    assert flag_overrides(args) == {
        "redis.url": "redis://h:1/0", "policies.path": "p/", "policies.shadow_path": "s.yaml",
        "routing.region": "eu", "routing.zone": "eu-1a", "logging.level": "debug",
        "backends": ["http://b:1"], "port": 9000}
    dests = set(vars(build_parser().parse_args(["serve"]))) - {"command", "config"}
    assert dests <= PATHS, f"flags that set no setting: {dests - PATHS}"
    s = load_settings(None, flag_overrides(args), environ={"GATEWAY_ROUTING_ZONE": "eu-1c"})
    assert (s.routing.zone, s.logging.level, s.port) == ("eu-1c", "DEBUG", 9000)  # env wins


def test_bad_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1, 2\n")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(bad, None, environ={})
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml", None, environ={})
    bad.write_text("- port\n")
    with pytest.raises(SettingsError, match="must hold a mapping"):
        load_settings(bad, None, environ={})
    bad.write_text("redis: redis://h:1\n")
    with pytest.raises(SettingsError, match=rf"^redis: is a section \(in {bad}\): give a "
                                            r"mapping of its settings \(url, cluster"):
        load_settings(bad, None, environ={})
    with pytest.raises(SettingsError, match=r"^port: "):
        load_settings(None, None, environ={"GATEWAY_PORT": "x"})


@pytest.mark.parametrize(("env", "message"), [
    ({"GATEWAY_ADMISSION_ADAPTIVE_BUFFER": "11"},
     "gateway: invalid settings: admission.adaptive.buffer: must be between 0 and 10 (got 11.0)"),
    ({"GATEWAY_TIER_CONCURRENCY": "8"},
     "gateway: invalid settings: GATEWAY_TIER_CONCURRENCY: this setting is now "
     "admission.tier_concurrency: set GATEWAY_ADMISSION_TIER_CONCURRENCY instead"),
])
def test_a_bad_setting_stops_start_up_with_exit_2(env: dict[str, str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--backend", "http://127.0.0.1:9",
         "--workers", "1"],
        cwd=REPO, env={**gateway_env(), **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == message


def test_every_setting_is_documented() -> None:
    """docs/SETTINGS.md's tables name every field, gateway and backend alike: gateway settings
    by dotted name, each section with its environment namespace, and the naming rule."""
    readme = (REPO / "docs" / "SETTINGS.md").read_text(encoding="utf-8")
    gateway_missing = [s.path for s in settings_fields() if f"`{s.path}`" not in readme]
    namespaces = [f"`GATEWAY_{section.upper().replace('.', '_')}_<FIELD>`"
                  for section in SECTIONS]
    missing_namespaces = [n for n in namespaces if n not in readme]
    backend_missing = [f.name for f in dataclasses.fields(ServeSettings)
                       if f"BACKEND_{f.name.upper()}" not in readme
                       and f"--{f.name.replace('_', '-')}" not in readme]
    assert gateway_missing == [] and missing_namespaces == [] and backend_missing == []
    assert "`GATEWAY_<FIELD>`" in readme
