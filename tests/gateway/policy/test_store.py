"""PolicyStore: reloads that keep the last good policy, mtime polling, shadow differences."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.adapters.registry import CACHED_PATHS
from gateway.errors import PolicyRejected
from gateway.policy import PolicyError, default_policy, evaluate
from gateway.policy.store import PolicyStore, differences
from gateway.policy.targets import KnownModels
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver

GOOD = "version: one\nrules:\n  - name: all\n    ttl: 1h\n"
GOOD_TWO = "version: two\nrules:\n  - name: all\n    ttl: 2h\n"
BAD = "version: three\nrules:\n  - name: all\n    ttl: whenever\n"
ARGS: dict[str, Any] = {
    "route": "/v1/embeddings", "model": "minilm", "tenant": "acme", "headers": {},
}


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry())


def sample(m: GatewayMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def rewrite(path: Path, text: str) -> None:
    """Write and move the mtime forward, so even a coarse-grained clock sees the change."""
    path.write_text(text, encoding="utf-8")
    later = time.time_ns() + 2_000_000_000
    os.utime(path, ns=(later, later))


async def wait_for(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - polling the store is what is under test
            await asyncio.sleep(0.02)


def test_without_files_the_built_in_default_is_active(metrics: GatewayMetrics) -> None:
    store = PolicyStore([], observer=MetricsObserver(metrics))
    assert store.active == default_policy()
    assert store.shadow is None
    assert sample(metrics, "gateway_policy_active", version=store.active.version) == 1
    assert sample(metrics, "gateway_policy_info", version=store.active.version,
                  sources="<built-in default>") == 1


def test_an_invalid_file_at_start_up_raises(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BAD)
    with pytest.raises(PolicyError):
        PolicyStore([path])


async def test_reload_swaps_in_a_valid_change(tmp_path: Path, metrics: GatewayMetrics) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    store = PolicyStore([path], observer=MetricsObserver(metrics))
    old = store.active.version
    rewrite(path, GOOD_TWO)
    new = await store.reload()
    assert new is store.active
    assert new.version.startswith("two+")
    assert store.active.rules[0].ttl_s == 7200
    assert sample(metrics, "gateway_policy_reloads_total", result="success") == 1
    assert sample(metrics, "gateway_policy_active", version=old) == 0
    assert sample(metrics, "gateway_policy_active", version=new.version) == 1


async def test_invalid_reload_keeps_the_last_good_policy(
    tmp_path: Path, metrics: GatewayMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    store = PolicyStore([path], observer=MetricsObserver(metrics))
    good = store.active
    rewrite(path, BAD)
    with caplog.at_level(logging.ERROR, "gateway.policy"), pytest.raises(PolicyError) as info:
        await store.reload()
    assert info.value.errors[0].line == 4
    assert store.active is good
    # Serving goes on with the old policy.
    assert evaluate(store.active, texts=["hello"], **ARGS).rule.ttl_s == 3600
    assert sample(metrics, "gateway_policy_reloads_total", result="failure") == 1
    assert sample(metrics, "gateway_policy_active", version=good.version) == 1
    [record] = [r for r in caplog.records if r.name == "gateway.policy"]
    line = record.getMessage()
    assert "\n" not in line
    assert good.version in line and f"{path}:4: rules[0].ttl" in line


async def test_polling_picks_up_a_change_and_refuses_a_bad_one(
    tmp_path: Path, metrics: GatewayMetrics
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    store = PolicyStore([path], observer=MetricsObserver(metrics), poll_interval_s=0.02)
    await store.start()
    try:
        rewrite(path, GOOD_TWO)
        await wait_for(lambda: store.active.version.startswith("two+"))
        rewrite(path, BAD)
        await wait_for(lambda: sample(metrics, "gateway_policy_reloads_total",
                                      result="failure") == 1)
        await asyncio.sleep(0.2)  # many polls later: the same bad file is not retried
        assert sample(metrics, "gateway_policy_reloads_total", result="failure") == 1
        assert store.active.version.startswith("two+")
    finally:
        await store.stop()
    assert store._task is None


async def test_polling_a_folder_sees_added_files(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "10-a.yaml").write_text("rules:\n  - name: a\n    match: {tenants: [x]}\n")
    store = PolicyStore([folder], poll_interval_s=0.02)
    await store.start()
    try:
        rewrite(folder / "20-b.yaml", "rules:\n  - name: b\n")
        await wait_for(lambda: [r.name for r in store.active.rules] == ["a", "b"])
    finally:
        await store.stop()


def test_shadow_differences_are_counted_by_rule(tmp_path: Path, metrics: GatewayMetrics) -> None:
    active_file = tmp_path / "active.yaml"
    active_file.write_text("rules:\n  - name: cached\n")
    shadow_file = tmp_path / "shadow.yaml"
    shadow_file.write_text("rules:\n  - name: shared\n    scope: shared\n    ttl: 2h\n"
                           "    privacy: {detectors: {email: redact}}\n")
    store = PolicyStore([active_file], observer=MetricsObserver(metrics),
                        shadow_paths=[shadow_file])
    assert store.shadow is not None
    texts = ["hi", "mail a@b.example.com"]
    active = evaluate(store.active, texts=texts, **ARGS)
    shadow = evaluate(store.shadow, texts=texts, **ARGS)
    assert store.compare_shadow(active, shadow) == ("scope", "ttl", "store", "text")
    assert sample(metrics, "gateway_policy_shadow_differences_total",
                  rule="cached", shadow_rule="shared", field="scope") == 1
    assert store.compare_shadow(active, active) == ()
    assert store.compare_shadow(active, None) == ("outcome",)
    assert sample(metrics, "gateway_policy_shadow_differences_total",
                  rule="cached", shadow_rule="rejected", field="outcome") == 1


def test_differences_of_equal_and_rejected_decisions() -> None:
    d = evaluate(default_policy(), texts=["x"], **ARGS)
    assert differences(d, d) == ()
    assert differences(None, None) == ()
    assert differences(None, d) == ("outcome",)


def test_record_decision(metrics: GatewayMetrics) -> None:
    MetricsObserver(metrics).policy_decided(
        evaluate(default_policy(), texts=["a", "b@c.example.com"], **ARGS))
    assert sample(metrics, "gateway_policy_decisions_total", rule="default",
                  decision="no_store_items") == 1
    assert sample(metrics, "gateway_pii_detections_total", detector="email",
                  action="no_store") == 1


def test_record_rejection(metrics: GatewayMetrics) -> None:
    MetricsObserver(metrics).policy_rejected(PolicyRejected("input", "card", "strict"))
    assert sample(metrics, "gateway_policy_decisions_total", rule="strict", decision="reject") == 1
    assert sample(metrics, "gateway_pii_detections_total", detector="card", action="reject") == 1


REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_policies_folder_starts_the_store_with_the_default(
    metrics: GatewayMetrics,
) -> None:
    # `--policies policies/`: only default.yaml is read; examples/ is a subfolder.
    store = PolicyStore([REPO / "policies"], observer=MetricsObserver(metrics),
                        models=KnownModels(routes=CACHED_PATHS, names=("minilm",)))
    assert store.active.rules == default_policy().rules
    assert store.active.sources == (str(REPO / "policies" / "default.yaml"),)


async def test_a_reload_with_a_rule_that_can_never_match_is_refused(
    tmp_path: Path, metrics: GatewayMetrics
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: e\n    match: {routes: /v1/embeddings, models: minilm}\n")
    store = PolicyStore([path], observer=MetricsObserver(metrics),
                        models=KnownModels(routes=CACHED_PATHS, names=("minilm",)))
    good = store.active
    for text in ("rules:\n  - name: e\n    match: {routes: [/v1/embedings]}\n",
                 "rules:\n  - name: e\n    match: {models: [minilm-v2]}\n"):
        rewrite(path, text)
        with pytest.raises(PolicyError) as info:
            await store.reload()
        [issue] = info.value.errors
        assert (issue.file, issue.line) == (str(path), 3)
        assert store.active is good
    assert sample(metrics, "gateway_policy_reloads_total", result="failure") == 2
