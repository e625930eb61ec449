"""The stats snapshot and the /dashboard page, the page checked in a real headless Chromium.

Chromium is the OS package (``apt-get install chromium``). Under CI (``CI=true``) a missing
Chromium fails the test; elsewhere the browser test is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import math
import os
import re
import shutil
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http import app_state as state
from gateway.http.routes import dashboard
from gateway.http.routes.ops import register
from gateway.http.stats import Stats
from gateway.routing.balancer import Router
from gateway.routing.config import BackendSpec, RoutingSettings
from gateway.settings import load_settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.samples import histogram_quantile, is_inference_route
from tests.conftest import REPO
from tests.gateway.conftest import BackendProc

ARTIFACTS = REPO / "test-artifacts"
TOKEN = "dash-token-0123456789abcdef"
EMBED = "/v1/embeddings"


async def ops_client(aiohttp_client: Any, backend: BackendProc, **overrides: Any) -> TestClient[
        Any, Any]:
    """A gateway on a real socket with the ops routes registered (until create_app does it)."""
    values: dict[str, Any] = {"backends": [backend.url], "routing.health_interval_s": 0.5}
    values.update(overrides)
    app = create_app(load_settings(None, values, environ={}), registry=CollectorRegistry())
    if not any(r.canonical == "/dashboard" for r in app.router.resources()):
        register(app)
    client: TestClient[Any, Any] = await aiohttp_client(TestServer(app))
    return client


async def embed(client: TestClient[Any, Any], texts: list[str]) -> str:
    resp = await client.post(EMBED, json={"model": "minilm", "input": texts})
    assert resp.status == 200, await resp.text()
    return str(resp.headers["X-Cache"])


# -- quantile estimation (pure) ------------------------------------------------------------------


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # 10 observations in (0, 1], 10 in (1, 2]: the median sits on the 1.0 bound.
    buckets = [(1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.0)
    assert histogram_quantile(0.75, buckets) == pytest.approx(1.5)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.5)  # from 0 in the first bucket
    assert histogram_quantile(1.0, buckets) == pytest.approx(2.0)


def test_histogram_quantile_edges() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    # A rank past the last finite bound answers that bound (Prometheus does the same).
    assert histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 10.0)]) == pytest.approx(0.1)
    # Empty buckets before the rank are skipped, not interpolated across.
    buckets = [(0.001, 0.0), (0.01, 0.0), (0.1, 4.0), (math.inf, 4.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01 + 0.09 * 0.5)


def test_inference_routes() -> None:
    assert is_inference_route("/v1/embeddings")
    assert is_inference_route("/v2/models/{name}/infer")
    assert not is_inference_route("/dashboard/stats.json")
    assert not is_inference_route("/admin/stats")
    assert not is_inference_route("/healthz")


def test_csp_allows_exactly_the_inline_blocks() -> None:
    html = dashboard.load_page()
    csp = dashboard.content_security_policy(html)
    script = re.search(rb"<script>(.*?)</script>", html, re.DOTALL)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1)).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert "unsafe-inline" not in csp and "default-src 'none'" in csp
    assert b"http://" not in html.replace(b"http://www.w3.org/2000/svg", b"")  # no outside assets
    assert b"https://" not in html


# -- several worker processes ---------------------------------------------------------------------

_WORKER = """
import sys
from prometheus_client import CollectorRegistry
from gateway.telemetry.metrics import GatewayMetrics
m = GatewayMetrics(CollectorRegistry())
n = int(sys.argv[1])
m.requests.labels("/v1/embeddings", "200", "HIT").inc(n)
m.request_duration.labels("/v1/embeddings", "HIT").observe(0.002)
m.cache_items.labels("minilm", "public", "hit").inc(n)
m.cache_items.labels("minilm", "public", "miss").inc(1)
m.shed.labels("queue_full").inc(2)
m.backend_healthy.labels("b:1", "z").set(1)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="multiprocess metrics files need Linux")
async def test_stats_add_up_across_worker_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two worker processes write metrics; one process's snapshot reports both."""
    from gateway.policy.store import PolicyStore

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", _WORKER, str(n),
                                                  cwd=REPO, env=env) for n in (3, 4)]
    assert [await asyncio.wait_for(p.wait(), 60) for p in procs] == [0, 0]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics = GatewayMetrics(CollectorRegistry())
    router = Router([BackendSpec(url="http://b:1", zone="z")], RoutingSettings(zone="z"))
    store = PolicyStore([])
    await store.reload()
    snap = Stats(metrics.registry, router=router, policies=store).snapshot()
    assert snap["requests"]["by_cache"] == {"HIT": 7.0}
    assert snap["items"]["by_result"] == {"hit": 7.0, "miss": 2.0}
    assert snap["hit_ratio"]["overall"] == pytest.approx(7 / 9)
    assert snap["shed"] == {"total": 4.0, "by_reason": {"queue_full": 4.0}}
    assert snap["latency_s"]["HIT"]["count"] == 2.0
    assert snap["backends"][0]["healthy_gauge"] == 1.0


# -- the stats JSON from a live gateway -----------------------------------------------------------


async def test_stats_json_after_traffic(aiohttp_client: Any, backend: BackendProc) -> None:
    client = await ops_client(aiohttp_client, backend)
    assert await embed(client, ["stats one", "stats two"]) == "MISS"
    assert await embed(client, ["stats one", "stats two"]) == "HIT"
    assert await embed(client, ["stats one", "stats three"]) == "MISS"  # one hit, one miss
    resp = await client.get("/dashboard/stats.json")
    assert resp.status == 200
    assert resp.headers["Cache-Control"] == "no-store"
    snap = await resp.json()
    assert snap["requests"]["total"] == 3
    assert snap["requests"]["by_cache"] == {"MISS": 2, "HIT": 1}
    assert snap["items"]["by_result"] == {"miss": 3, "hit": 3}
    assert snap["hit_ratio"]["overall"] == pytest.approx(0.5)
    assert snap["hit_ratio"]["by_model"] == {"minilm": pytest.approx(0.5)}
    assert snap["hit_ratio"]["by_tenant"] == {"public": pytest.approx(0.5)}
    assert snap["hit_ratio"]["by_tier"]["l1"] == pytest.approx(0.5)
    hit = snap["latency_s"]["HIT"]
    assert hit["count"] == 1 and 0 < hit["p50"] <= hit["p95"] <= hit["p99"]
    assert snap["compute_saved_s"]["total"] > 0
    # The adaptive limit (shipped default) holds min_limit while its first probe measures minRTT.
    assert snap["concurrency_limit"] == {"zone": 2}
    assert snap["inflight"] == {"zone": 0} and snap["queue_depth"] == {"zone": 0}
    assert snap["policy"]["version"] == client.app[state.POLICIES].active.version
    [b] = snap["backends"]
    assert b["healthy"] and b["available"] and b["healthy_gauge"] == 1.0
    assert b["requests"] == 2 and b["errors"] == 0
    assert b["latency_s"]["count"] == 2 and b["latency_s"]["p50"] > 0
    # The page's own polling is not traffic.
    again = await (await client.get("/dashboard/stats.json")).json()
    assert again["requests"]["total"] == 3


async def test_dashboard_needs_the_admin_token_when_one_is_set(
    aiohttp_client: Any, backend: BackendProc
) -> None:
    client = await ops_client(aiohttp_client, backend, admin_token=TOKEN)
    for path in ("/dashboard", "/dashboard/stats.json", "/dashboard?token=wrong"):
        resp = await client.get(path)
        assert resp.status == 401, path
        assert (await resp.json())["error"]["type"] == "unauthorized"
    page = await client.get(f"/dashboard?token={TOKEN}")
    assert page.status == 200 and page.content_type == "text/html"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert "sha256-" in page.headers["Content-Security-Policy"]
    resp = await client.get("/dashboard/stats.json", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status == 200


async def test_dashboard_is_open_without_an_admin_token(
    aiohttp_client: Any, backend: BackendProc
) -> None:
    client = await ops_client(aiohttp_client, backend)
    assert (await client.get("/dashboard")).status == 200
    assert (await client.get("/dashboard/stats.json")).status == 200


# -- the page in a real browser -------------------------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed (CI must install it: apt-get install chromium)")
    pytest.skip("chromium is not installed; apt-get install chromium to run the browser test")


async def run_chromium(url: str, *extra: str) -> str:
    """Load ``url`` in headless Chromium (5 s of virtual time); returns its stdout."""
    with tempfile.TemporaryDirectory(prefix="gw-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
            "--virtual-time-budget=5000", *extra, url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 90.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


class Dom(HTMLParser):
    """Text and class of every element with an id (enough to read the dashboard's values)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.classes: dict[str, str] = {}
        self._open: list[str | None] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        ident = a.get("id")
        if ident:
            self.text[ident] = ""
            self.classes[ident] = a.get("class") or ""
        if tag not in ("meta", "link", "br", "img", "input", "polyline", "polygon"):
            self._open.append(ident)

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("meta", "link", "br", "img", "input", "polyline", "polygon") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for ident in self._open:
            if ident:
                self.text[ident] += data


def percent(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)%\s*", text)
    assert m, f"not a percentage: {text!r}"
    return float(m.group(1))


async def test_dashboard_in_headless_chromium(aiohttp_client: Any, backend: BackendProc) -> None:
    chromium()
    client = await ops_client(aiohttp_client, backend, admin_token=TOKEN)
    for texts in (["browser a", "browser b"], ["browser a", "browser b"], ["browser c"],
                  ["browser a"]):
        await embed(client, texts)
    url = str(client.make_url("/dashboard").with_query(token=TOKEN))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    dom = Dom(await run_chromium(url, "--dump-dom"))

    async def traffic() -> None:
        # Paced live traffic (hits, and a new text now and then) while the screenshot is
        # taken, so the artifact shows the rates and sparklines moving. Bounded in count.
        for i in range(400):
            text = f"browser new {i}" if i % 10 == 0 else f"browser {i % 5}"
            await embed(client, [text, "browser a"])
            await asyncio.sleep(0.005)

    background = asyncio.create_task(traffic())
    try:
        await run_chromium(url, f"--screenshot={shot}", "--window-size=1280,1000",
                           "--hide-scrollbars")
    finally:
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
    assert shot.exists() and shot.stat().st_size > 10_000

    assert "shown" not in dom.classes["error-banner"], dom.text["error-banner"]
    assert dom.classes["status-dot"] == "ok"
    assert percent(dom.text["hit-ratio"]) == pytest.approx(50.0)  # 3 of 6 items from cache
    assert int(dom.text["req-total"].replace(",", "")) == 4
    version = client.app[state.POLICIES].active.version
    assert dom.text["policy-version"] == version
    assert re.fullmatch(r"[0-9.]+", dom.text["req-rate"])  # a rate needs two polls: it polled
    assert "HIT" in dom.text["latency-body"] and "ms" in dom.text["latency-body"]
    assert "up" in dom.text["backend-body"]
    # Ready when the gateway started: not a cold start (no readies, steady).
    assert "steady" in dom.text["coldstart-body"] and "no data" not in dom.text["coldstart-body"]
    assert "public" in dom.text["tenant-body"] and "minilm" in dom.text["model-body"]
    # The embedded default: no Redis, the node tier on (its row shows its size).
    assert dom.text["redis-state"] == "off (L1 + node)"
    assert "node" in dom.text["tier-body"] and "KiB" in dom.text["tier-body"]


async def test_dashboard_shows_an_error_when_stats_fail(aiohttp_client: Any) -> None:
    """The real page against a stats route that fails: the banner must say so."""
    chromium()

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": {"type": "internal_error"}}, status=500)

    app = web.Application()
    html = dashboard.load_page()

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=html, content_type="text/html")

    async def history(request: web.Request) -> web.Response:
        return web.json_response({"interval_s": 1, "window_s": 900, "points": []})

    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/stats.json", broken)
    app.router.add_get("/dashboard/history.json", history)
    client = await aiohttp_client(TestServer(app))
    dom = Dom(await run_chromium(str(client.make_url("/dashboard")), "--dump-dom"))
    assert "shown" in dom.classes["error-banner"]
    assert "HTTP 500" in dom.text["error-banner"]
    assert dom.classes["status-dot"] == "err"
