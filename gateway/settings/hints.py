"""Hints for names the model does not have: an old flat name's new place, or the closest name.

The flat model before sections named ``l1_max_entries``, ``tier_concurrency``, ``log_level``...;
``MOVED`` says where each went, so a config file or environment written for it is refused with
the new name rather than half applied.
"""

from __future__ import annotations

import difflib

from gateway.settings.fields import Setting, sections, settings_fields

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
    "eject_after_failures": "routing.consecutive_gateway_failure",
    "hedge": "routing.hedge_after_p95",
    "tier_concurrency": "admission.tier_concurrency", "tier_queue": "admission.tier_queue",
    "adaptive_concurrency": "admission.adaptive.enabled",
    "adaptive_window_ms": "admission.adaptive.window_s",
    "adaptive_percentile": "admission.adaptive.percentile",
    "adaptive_buffer": "admission.adaptive.buffer",
    "adaptive_min_limit": "admission.adaptive.min_limit",
    "adaptive_probe_interval_s": "admission.adaptive.probe_interval_s",
    "adaptive_probe_requests": "admission.adaptive.probe_requests",
    "log_level": "logging.level", "log_request_text": "logging.request_text",
    # Renamed inside a section since: Envoy's name for the same outlier check.
    "routing.eject_after_failures": "routing.consecutive_gateway_failure",
}
_NOW_SECONDS = {"redis_timeout_ms", "connect_timeout_ms", "read_timeout_ms", "adaptive_window_ms"}


def unit(old: str) -> str:
    """What changed besides the name (milliseconds became seconds)."""
    return " (in seconds)" if old in _NOW_SECONDS else ""


def suggestion(path: str) -> str | None:
    """Where a setting named ``path`` probably is: its new place, a setting of the same name in
    another section, or the closest name."""
    if path in MOVED:
        return MOVED[path] + unit(path)
    leaf = path.rsplit(".", 1)[-1]
    same = [s.path for s in settings_fields() if s.path.rsplit(".", 1)[-1] == leaf]
    if same:
        return " or ".join(same)
    names = [s.path for s in settings_fields()] + list(sections())
    close = difflib.get_close_matches(path, names, n=1, cutoff=0.6)
    return close[0] if close else None


def env_suggestion(name: str, known: list[str]) -> str:
    """For an unknown ``GATEWAY_*`` name: the old name's replacement, or the closest one."""
    old = name.removeprefix("GATEWAY_").lower()
    if old in MOVED:
        new = MOVED[old]
        return f"this setting is now {new}{unit(old)}: set {Setting(new, None, None).env} instead"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    return "no such setting" + (f"; did you mean {close[0]}?" if close else "")
