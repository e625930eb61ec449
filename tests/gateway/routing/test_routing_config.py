"""Routing settings: defaults, normalisation, and errors that name the field."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.routing.config import BackendSpec, RoutingSettings


def test_backend_name_defaults_to_host_port_and_url_is_normalised() -> None:
    spec = BackendSpec(url="http://127.0.0.1:8001/", zone="a", region="r1")
    assert spec.url == "http://127.0.0.1:8001"
    assert spec.name == "127.0.0.1:8001"
    assert spec.label == "127.0.0.1:8001"
    assert BackendSpec(url="http://backend").name == "backend:80"
    assert BackendSpec(url="http://b:1", name="gpu-1").name == "gpu-1"


def test_backend_compact_form() -> None:
    """``URL[@REGION[/ZONE]]``, the form flags and environment variables use."""
    assert BackendSpec.parse("http://a:1@eu/eu-1a") == BackendSpec(url="http://a:1", region="eu",
                                                                   zone="eu-1a")
    assert BackendSpec.parse(" http://a:1@eu ") == BackendSpec(url="http://a:1", region="eu",
                                                               zone="eu")
    assert BackendSpec.parse("http://a:1") == BackendSpec(url="http://a:1")
    with pytest.raises(ValueError, match="url"):
        BackendSpec.parse("a:1@eu")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "127.0.0.1:8000"}, "url"),
        ({"url": "ftp://h:1"}, "url"),
        ({"url": "http://h:1/v2"}, "url"),
        ({"url": "http://h:99999"}, "port"),
        ({"url": "http://h:1", "zone": ""}, "zone"),
        ({"url": "http://h:1", "region": " "}, "region"),
        ({"url": "http://h:1", "name": ""}, "name"),
    ],
)
def test_backend_spec_rejects_bad_values(kwargs: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BackendSpec(**kwargs)


def test_settings_are_frozen_and_keyword_only() -> None:
    settings = RoutingSettings()
    assert (settings.region, settings.zone) == ("local", "local")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.zone = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        RoutingSettings("r1")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"health_interval_s": 0}, "health_interval_s"),
        ({"health_timeout_s": -1.0}, "health_timeout_s"),
        ({"read_timeout_s": float("inf")}, "read_timeout_s"),
        ({"base_ejection_s": 10.0, "max_ejection_s": 5.0}, "max_ejection_s"),
        ({"consecutive_5xx": -1}, "consecutive_5xx"),
        ({"consecutive_gateway_failure": 1.5}, "consecutive_gateway_failure"),
        ({"success_rate_request_volume": 0}, "success_rate_request_volume"),
        ({"outlier_interval_s": 0}, "outlier_interval_s"),
        ({"slow_start_window_s": -1}, "slow_start_window_s"),
        ({"slow_start_aggression": 0}, "slow_start_aggression"),
        ({"slow_start_min_weight_percent": 0}, "slow_start_min_weight_percent"),
        ({"num_retries": -1}, "num_retries"),
        ({"per_try_timeout_ms": 0}, "per_try_timeout_ms"),
        ({"retry_budget_percent": 101}, "retry_budget_percent"),
        ({"retry_budget_min_concurrency": -1}, "retry_budget_min_concurrency"),
        ({"retry_on": ("connect-failure", "4xx")}, "retry_on"),
        ({"retry_on": "5xx"}, "retry_on"),
        ({"retriable_status_codes": (503, 404)}, "retriable_status_codes: must be 5xx"),
        ({"max_ejected_percent": 101}, "max_ejected_percent"),
        ({"ewma_alpha": 0.0}, "ewma_alpha"),
        ({"ewma_alpha": 1.5}, "ewma_alpha"),
        ({"pool_size": 0}, "pool_size"),
        ({"max_inflight_per_backend": 0}, "max_inflight_per_backend"),
        ({"retry": "yes"}, "retry"),
        ({"hedge_after_p95": 1}, "hedge_after_p95"),
        ({"hedge_min_samples": 0}, "hedge_min_samples"),
        ({"unhealthy_threshold": 0}, "unhealthy_threshold"),
        ({"zone": ""}, "zone"),
    ],
)
def test_settings_reject_bad_values_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RoutingSettings(**kwargs)  # type: ignore[arg-type]
