"""Quotas without I/O: the GCRA and daily arithmetic, the local limiter, the RateLimit headers,
the tenants file's quota fields, and the bounded tenant labels."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway.errors import RateLimited
from gateway.telemetry.tenant_labels import OTHER, TenantLabels
from gateway.tenants.directory import Tenants, TenantsError, key_digest
from gateway.tenants.quota.gcra import DAY_S, Limit, daily, rate
from gateway.tenants.quota.limiter import QuotaGate, limits_of
from gateway.tenants.quota.local import LocalLimiter
from gateway.tenants.quota.settings import QuotaSettings
from gateway.tenants.quota.spec import Quota, TenantSpec
from gateway.tenants.store import TenantStore
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE
from tests.conftest import REPO

TEN_PER_S = Limit("requests", "rate", 10.0, 5)


def test_gcra_lets_a_burst_through_then_one_per_interval() -> None:
    tat, now = 0.0, 1000.0
    remaining = []
    for _ in range(5):
        verdict, tat = rate(TEN_PER_S, tat, now, 1)
        assert verdict.allowed
        remaining.append(verdict.remaining)
    assert remaining == [4, 3, 2, 1, 0]
    refused, same = rate(TEN_PER_S, tat, now, 1)
    assert not refused.allowed and same == tat and refused.remaining == 0
    assert refused.retry_s == pytest.approx(0.1)  # one interval at 10/s
    assert refused.reset_s == pytest.approx(0.5)  # the whole burst back
    later, tat = rate(TEN_PER_S, tat, now + 0.1, 1)
    assert later.allowed and later.remaining == 0
    peek, unchanged = rate(TEN_PER_S, tat, now + 0.3, 0)  # cost 0 only reads
    assert peek.allowed and peek.remaining == 2 and unchanged == tat


def test_a_charge_larger_than_the_burst_passes_on_a_whole_limit_and_leaves_debt() -> None:
    verdict, tat = rate(TEN_PER_S, 0.0, 1000.0, 12)
    assert verdict.allowed and verdict.remaining == 0
    assert tat == pytest.approx(1001.2)
    again, _ = rate(TEN_PER_S, tat, 1000.5, 1)  # still paying it back
    assert not again.allowed and again.retry_s == pytest.approx(0.3)


def test_daily_budget_resets_at_utc_midnight() -> None:
    budget = Limit("daily", "day", 100.0)
    noon = 20_000 * DAY_S + DAY_S / 2
    ok, used = daily(budget, 90.0, noon, 10)
    assert ok.allowed and ok.remaining == 0 and used == 100.0
    refused, same = daily(budget, used, noon, 1)
    assert not refused.allowed and same == used
    assert refused.retry_s == pytest.approx(DAY_S / 2) == refused.reset_s


class Clock:
    def __init__(self, now: float = 20_000 * DAY_S + 3600.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_local_limiter_charges_all_limits_or_none_and_scales_by_its_fraction() -> None:
    clock = Clock()
    local = LocalLimiter(clock=clock)
    texts = Limit("texts", "rate", 100.0, 10)
    day = Limit("daily", "day", 15.0)
    assert all(v.allowed for v in local.apply("acme", [(texts, 8), (day, 8)]))
    refused = local.apply("acme", [(texts, 8), (day, 8)])  # the day says no: texts untouched
    assert [v.allowed for v in refused] == [False, False]
    assert local.apply("acme", [(texts, 2), (day, 2)])[0].remaining == 0
    assert local.apply("beta", [(texts, 10)])[0].allowed  # tenants apart
    clock.now += DAY_S  # a new day, and the rate long whole again
    assert all(v.allowed for v in local.apply("acme", [(texts, 8), (day, 8)]))

    half = LocalLimiter(fraction=0.5, clock=clock)
    assert half.apply("acme", [(texts, 5)])[0].allowed
    assert not half.apply("acme", [(texts, 1)])[0].allowed  # 5 of 10 per process


def make_gate(quota: Quota, **settings: object) -> tuple[QuotaGate, Clock]:
    clock = Clock()
    tenants = Tenants(keys=(), configured=True, specs={"acme": TenantSpec(quota=quota)})
    gate = QuotaGate(QuotaSettings(**settings),  # type: ignore[arg-type]
                     TenantStore(None, tenants=tenants), local=LocalLimiter(clock=clock))
    return gate, clock


async def test_headers_name_every_limit_with_its_window_and_what_is_left() -> None:
    gate, _ = make_gate(Quota(requests_per_s=2, requests_burst=4, texts_per_s=50,
                                  texts_per_day=1000))
    assert gate.state("beta") is None  # no limits: nothing checked, no headers
    state = gate.state("acme")
    assert state is not None and state.headers() == {}
    await state.admit()
    assert state.headers() == {
        "RateLimit-Policy": '"requests";q=4;w=2, "texts";q=50;w=1, "daily";q=1000;w=86400',
        "RateLimit": '"requests";r=3;t=1, "texts";r=50;t=0, "daily";r=1000;t=82800',
    }
    await state.charge(30, 100)  # hits are free by default
    assert state.headers()["RateLimit"] == '"requests";r=3;t=1, "texts";r=20;t=1, ' \
                                           '"daily";r=970;t=82800'
    with pytest.raises(RateLimited) as info:
        await state.charge(21, 0)
    assert info.value.status == 429
    assert info.value.headers() == {"Retry-After": "1"}
    assert "50 texts per second" in info.value.message
    assert state.headers()["RateLimit"].startswith('"requests";r=3;t=1, "texts";r=20;')


async def test_cache_hits_cost_what_the_setting_says() -> None:
    gate, _ = make_gate(Quota(texts_per_s=1, texts_burst=10), hit_cost=0.5)
    state = gate.state("acme")
    assert state is not None
    await state.charge(0, 10)
    assert state.verdicts["texts"].remaining == 5
    off, _ = make_gate(Quota(requests_per_s=1), enabled=False)
    assert off.state("acme") is None


def test_limits_of_a_quota_default_the_burst_to_one_second() -> None:
    requests, texts = limits_of(Quota(requests_per_s=2.5, texts_per_s=0.2, texts_per_day=9))
    assert requests == Limit("requests", "rate", 2.5, 3)
    assert texts == (Limit("texts", "rate", 0.2, 1), Limit("daily", "day", 9.0))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def test_the_tenants_file_sets_quotas_weights_and_classes_over_its_defaults(
        tmp_path: Path) -> None:
    tenants = Tenants.load(write(tmp_path, f"""
        defaults:
          priority: interactive
          quota: {{requests_per_s: 20, texts_per_s: 200, texts_per_day: 1000}}
        tenants:
          acme:
            api_keys_sha256: ["{key_digest('a')}"]
            weight: 2.5
            quota: {{texts_per_s: 500, texts_per_day: null}}
          nightly:
            api_keys_sha256: ["{key_digest('n')}"]
            priority: batch
    """))
    acme, nightly = tenants.spec("acme"), tenants.spec("nightly")
    assert acme == TenantSpec(weight=2.5, quota=Quota(requests_per_s=20, texts_per_s=500))
    assert nightly.priority == BATCH and nightly.weight == 1.0
    assert nightly.quota == Quota(requests_per_s=20, texts_per_s=200, texts_per_day=1000)
    assert tenants.spec("unknown") == tenants.default
    assert Tenants.public().spec("public") == TenantSpec(priority=INTERACTIVE)


@pytest.mark.parametrize(("body", "message"), [
    ("  acme:\n    api_keys_sha256: []\n    weight: 0\n",
     ":4: tenants.acme.weight: must be a number from 0.001 to 1000"),
    ("  acme:\n    api_keys_sha256: []\n    priority: urgent\n",
     ":4: tenants.acme.priority: must be one of interactive, batch (got 'urgent')"),
    ("  acme:\n    api_keys_sha256: []\n    quota: {requests_per_s: -1}\n",
     ":4: tenants.acme.quota.requests_per_s: must be a number > 0"),
    ("  acme:\n    api_keys_sha256: []\n    quota: {texts_burst: 1.5}\n",
     ":4: tenants.acme.quota.texts_burst: must be an integer >= 1"),
    ("  acme:\n    api_keys_sha256: []\n    quota: {rps: 1}\n",
     ":4: tenants.acme.quota.rps: unknown field; allowed: requests_per_s"),
])
def test_bad_quota_fields_name_file_line_and_field(tmp_path: Path, body: str,
                                                   message: str) -> None:
    path = write(tmp_path, "tenants:\n" + body)
    with pytest.raises(TenantsError) as info:
        Tenants.load(path)
    assert f"{path}{message}" in str(info.value)


def test_the_readme_tenants_example_loads(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("```yaml\ndefaults:") + len("```yaml\n")
    text = readme[start:readme.index("```", start)]
    text = text.replace(text[text.index('["<') + 1:text.index('>"]') + 2], f'"{"a" * 64}"')
    tenants = Tenants.load(write(tmp_path, text))
    assert tenants.spec("acme").quota == Quota(requests_per_s=20, texts_per_s=500,
                                               texts_burst=1000)
    assert tenants.spec("acme").weight == 2


def test_bad_defaults_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults:\n  quota: 5\n  colour: red\ntenants: {}\n")
    with pytest.raises(TenantsError) as info:
        Tenants.load(path)
    text = str(info.value)
    assert ":2: defaults.quota: expected a mapping" in text
    assert ":3: defaults.colour: unknown field; allowed: weight, priority, quota" in text


def test_tenant_labels_are_bounded_and_follow_traffic() -> None:
    clock = Clock(0.0)
    labels = TenantLabels(2, clock=clock)
    assert [labels.label(t) for t in ("a", "b", "c", "d")] == ["a", "b", OTHER, OTHER]
    assert labels.of("c") == OTHER and labels.named == {"a", "b"}
    for _ in range(50):
        labels.label("c")  # c is busy now, b quiet
    labels.label("a")
    clock.now = 61.0
    labels.label("a")  # the minute is over: c takes the quietest place
    assert labels.named == {"a", "c"}
    assert labels.label("b") == OTHER and labels.label("c") == "c"


def test_tenant_labels_count_a_record_of_many_requests_as_many() -> None:
    # A hot answer's record labels ``times`` requests at once (telemetry/prometheus.py _hot):
    # d's 30 requests in one record outweigh a's 3 at the minute's turn.
    clock = Clock(0.0)
    labels = TenantLabels(1, clock=clock)
    assert labels.label("a", 3) == "a" and labels.label("d", 30) == OTHER
    clock.now = 61.0
    labels.label("a")  # the minute is over: the busier d takes the one place
    assert labels.named == {"d"} and labels.label("d") == "d"
