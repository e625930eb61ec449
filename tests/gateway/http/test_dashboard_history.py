"""The dashboard with its history, as ops open it: a real gateway with its default two workers,
real traffic, the page in headless Chromium (driven over the DevTools protocol, tests/gateway/
cdp.py) at common screen sizes.

Proves: the first paint already draws the host's history; the figures on the page match the
stats JSON; the history counts the requests both workers answered, whichever worker serves it;
nothing on the page is cut off or needs a sideways scroll. Saves screenshots in
``test-artifacts/`` (``docs/dashboard.png`` is one of them; ``DASHBOARD_TRAFFIC_S=150`` gives a
fuller picture).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.http.routes import dashboard
from gateway.http.stats import Stats
from gateway.policy.store import PolicyStore
from gateway.routing.balancer import Router
from gateway.routing.config import BackendSpec, RoutingSettings
from gateway.telemetry.metrics import GatewayMetrics
from tests.conftest import REPO, free_port
from tests.gateway.cdp import Browser
from tests.gateway.conftest import BackendProc, gateway_env, stop_process, wait_ready
from tests.gateway.http.test_dashboard import ARTIFACTS, TOKEN, chromium, embed, ops_client

TRAFFIC_S = float(os.environ.get("DASHBOARD_TRAFFIC_S", "6"))
SIZES = [(1280, 800), (1366, 768), (1400, 900), (1920, 1080)]  # laptop 1366x768 among them

# Every section, the page and every table: content wider than its box is cut off or scrolls.
_OVERFLOW = """(() => {
  const bad = [];
  const page = document.documentElement.scrollWidth;
  if (page > innerWidth) bad.push("page " + page + ">" + innerWidth);
  for (const el of document.querySelectorAll("section, .kpi")) {
    if (el.scrollWidth > el.clientWidth + 1) {
      const name = (el.querySelector("h2, .label") || el).textContent;
      bad.push(name + " " + el.scrollWidth + ">" + el.clientWidth);
    }
  }
  return bad;
})()"""


async def get_json(url: str) -> Any:
    # A new connection every time, so the kernel spreads them over both workers.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as s, s.get(url) as reply:
        assert reply.status == 200, await reply.text()
        return await reply.json()


async def send_traffic(base: str, seconds: float, *, tag: str = "") -> int:
    """Embeddings for ``seconds`` (at most 50 a second, 20,000 in all) on fresh connections,
    from a small set of texts (hits, and a new text now and then: misses); the count sent."""
    rng = random.Random(26)
    sent = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def one(i: int) -> None:
            nonlocal sent
            text = f"dashboard {rng.randrange(40)}" if i % 7 else f"dashboard new {tag}{i}"
            async with http.post(f"{base}/v1/embeddings",
                                 json={"model": "minilm", "input": text}) as reply:
                await reply.read()
                sent += 1
                assert reply.status == 200

        i = 0
        while loop.time() < end and i < 20_000:
            await asyncio.gather(*(one(i + k) for k in range(4)))
            i += 4
            await asyncio.sleep(0.08 + 0.04 * rng.random())
    return sent


def history_total(points: list[dict[str, Any]]) -> float:
    return float(sum(sum(p["requests"].values()) for p in points))


@pytest.mark.timeout(240 + 2 * TRAFFIC_S)  # processes, traffic and a browser on a busy machine
async def test_history_on_first_paint_with_two_workers(backend: BackendProc) -> None:
    exe = chromium()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = start_gateway(port, backend, log)
        try:
            await asyncio.to_thread(wait_ready, proc, f"{base}/readyz", timeout_s=90,
                                    what="gateway")
            await check_dashboard(exe, base)
            await check_takeover(base)
        finally:
            stop_process(proc)


def start_gateway(port: int, backend: BackendProc, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m gateway serve --workers 2``: the default on this two-core machine, said
    explicitly so the test holds on any."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--backend",
         backend.url, "--workers", "2"], cwd=REPO, env=gateway_env(),
        stdout=subprocess.DEVNULL, stderr=log)


async def check_dashboard(exe: str, base: str) -> None:
    # The sampler's first reading precedes the traffic, so the history holds all of it.
    deadline = time.monotonic() + 30
    while not (await get_json(f"{base}/dashboard/history.json"))["points"]:
        assert time.monotonic() < deadline, "the history never got a point"
        await asyncio.sleep(0.2)
    sent = await send_traffic(base, TRAFFIC_S)

    # Each worker hands its counts over within a second and the sampler reads once a second.
    deadline = time.monotonic() + 30
    while True:
        stats = await get_json(f"{base}/dashboard/stats.json")
        history = await get_json(f"{base}/dashboard/history.json")
        if history_total(history["points"]) >= sent or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert stats["requests"]["total"] == sent, "the stats JSON counts both workers"
    assert history_total(history["points"]) == sent, "the history is the host's, not a worker's"
    by_cache: dict[str, float] = {}
    for p in history["points"]:
        for cache, n in p["requests"].items():
            by_cache[cache] = by_cache.get(cache, 0) + n
    assert by_cache == stats["requests"]["by_cache"]
    assert {"HIT", "MISS"} <= set(by_cache)
    # Whichever worker answers, the same history (one sampler for the host).
    answers = [await get_json(f"{base}/dashboard/history.json") for _ in range(8)]
    assert len({a["sampler_pid"] for a in answers}) == 1
    shortest = min(len(a["points"]) for a in answers)
    assert shortest >= TRAFFIC_S
    assert len({tuple(p["t"] for p in a["points"][:shortest]) for a in answers}) == 1

    ARTIFACTS.mkdir(exist_ok=True)
    async with Browser(exe) as page:
        for width, height in SIZES:
            await page.size(width, height)
            await page.open(f"{base}/dashboard")
            charts = await wait_for_render(page)
            # The first paint drew the history, not one point from its own first poll.
            assert int(charts["firstPaintPoints"]) >= TRAFFIC_S, charts
            text = await page.evaluate("""({
              hit: document.getElementById("hit-ratio").textContent,
              total: document.getElementById("req-total").textContent,
              rps: document.getElementById("chart-rps-caption").textContent,
              window: document.getElementById("chart-hit-caption").textContent,
              hits: document.getElementById("chart-lat-hit-caption").textContent,
              misses: document.getElementById("chart-lat-miss-caption").textContent,
              banner: document.getElementById("error-banner").className,
              reserved: document.querySelectorAll("[data-reserved]").length,
            })""")
            assert "shown" not in text["banner"]
            assert text["total"] == f"{sent:,}"
            assert text["rps"] == f"{sent:,} requests in the window"
            assert text["hit"] == f"{100 * stats['hit_ratio']['overall']:.1f}%"
            assert text["window"] == f"over the window: {text['hit']}"
            for key, cache in (("hits", "HIT"), ("misses", "MISS")):
                count = int(stats["latency_s"][cache]["count"])
                assert text[key] == f"{count:,} {cache} requests in the window"
            assert text["reserved"] == 2  # the scheduling panels are charts now
            assert await page.evaluate(_OVERFLOW) == [], f"cut off at {width}x{height}"
            # Hovering a chart reads out the values of the second under the mouse.
            box = await page.evaluate("""(() => { const r = document.querySelector(
              "#chart-rps .plot").getBoundingClientRect();
              return {x: r.left + r.width * 0.995, y: r.top + r.height / 2}; })()""")
            await page.call("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"],
                            y=box["y"])
            tip = await page.evaluate("document.querySelector('#chart-rps .tip').innerText")
            assert re.fullmatch(r"\d\d:\d\d:\d\d\nall: [0-9.]+\n(.+: [0-9.]+\n?)+", tip), tip
            shot = ARTIFACTS / f"dashboard-{width}.png"
            shot.write_bytes(await page.screenshot())
            assert shot.stat().st_size > 20_000
            await check_scheduling_charts(page)  # last: it scrolls the page to hover

        # The picture for docs/OPERATIONS.md: the page open while traffic goes on.
        await page.size(1400, 900)
        await page.open(f"{base}/dashboard")
        live = asyncio.create_task(send_traffic(base, 8.0, tag="live "))
        try:
            await wait_for_render(page, renders=5)
            shot = ARTIFACTS / "dashboard.png"
            shot.write_bytes(await page.screenshot())
        finally:
            await live
        assert shot.stat().st_size > 20_000


_CHART = """((id) => ({
  points: Number(document.querySelector("#" + id + " svg").dataset.points),
  legend: [...document.querySelectorAll("#" + id + " .legend > span")].map((e) => e.textContent),
  caption: document.getElementById(id + "-caption").textContent,
}))"""


async def chart(page: Browser, ident: str) -> dict[str, Any]:
    """What one chart drew: its points (the longest series), legend items and caption."""
    result: dict[str, Any] = await page.evaluate(f"{_CHART}({ident!r})")
    return result


async def hover(page: Browser, ident: str, across: float) -> str:
    """The chart's readout with the mouse ``across`` its plot's width (scrolled into view)."""
    box = await page.evaluate(f"""(() => {{
      const plot = document.querySelector("#{ident} .plot");
      plot.scrollIntoView({{block: "center"}});
      const r = plot.getBoundingClientRect();
      return {{x: r.left + r.width * {across}, y: r.top + r.height / 2}}; }})()""")
    await page.call("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"], y=box["y"])
    tip: str = await page.evaluate(f"document.querySelector('#{ident} .tip').innerText")
    return tip


async def check_scheduling_charts(page: Browser) -> None:
    """The two scheduling panels drew the window's history of a real gateway: the limit
    against the calls in flight, the depth per class (0: nobody queued) and the wait per class
    (drawn when calls queued), beside the queue time the backend reported."""
    limit = await chart(page, "chart-limit")
    assert limit["points"] >= TRAFFIC_S, limit
    assert [item.rsplit(" ", 1)[0] for item in limit["legend"]] == ["limit zone", "in flight zone"]
    assert all(re.fullmatch(r".* \d+", item) for item in limit["legend"]), limit
    depth = await chart(page, "chart-priority-depth")
    assert depth["points"] >= TRAFFIC_S, depth
    assert depth["legend"] == ["interactive 0", "batch 0"], depth
    wait = await chart(page, "chart-priority-wait")
    names = [item.rsplit(" ", 2)[0] for item in wait["legend"]]
    # Few of this light traffic's misses queue (the limit probes at 3): the backend's line, always.
    assert any(name.startswith("in backend ") for name in names), wait
    assert wait["points"] >= 1 and re.match(r"[\d,]+ calls queued", wait["caption"])
    tip = await hover(page, "chart-limit", 0.995)
    assert re.fullmatch(r"\d\d:\d\d:\d\d\nlimit zone: \d+\nin flight zone: \d+", tip), tip


async def test_scheduling_panels_draw_queue_per_class_and_the_limit() -> None:
    """The page against a history with a backlog (served here, with a real stats snapshot):
    both classes' depth and wait, the backend's queue time, the limit moving under the calls
    in flight; what a quiet second leaves out of a point is drawn as 0, not as a gap."""
    exe = chromium()
    t0 = time.time() - 40
    points = []
    for i in range(40):
        p: dict[str, Any] = {"t": t0 + i, "dt": 1.0, "requests": {}, "items": {},
                             "hit_ratio": None, "tier_hit_ratio": {}, "latency_s": {},
                             "shed": {}, "queue_depth": {"zone": 0}, "inflight": {"zone": 3},
                             "backend_busy": {}, "limit": {"zone": 3 + i // 10}}
        if 10 <= i < 30:  # a backlog: interactive calls wait a little, batch ones longer
            p["queue_by_class"] = {"zone": {"interactive": 2, "batch": 7}}
            p["queue_depth"] = {"zone": 9}
            p["queue_wait_s"] = {
                "interactive": {"count": 40, "p50": 0.004, "p99": 0.02},
                "batch": {"count": 10, "p50": 0.3, "p99": 0.9}}
            p["backend_queue_s"] = {"b1:8000": {"count": 50, "p50": 0.001, "p99": 0.002}}
        points.append(p)
    router = Router([BackendSpec(url="http://b1:8000", zone="z")], RoutingSettings(zone="z"))
    store = PolicyStore([])
    await store.reload()
    stats = Stats(GatewayMetrics(CollectorRegistry()).registry, router=router,
                  policies=store).snapshot()
    html = dashboard.load_page()

    async def page_route(request: web.Request) -> web.Response:
        return web.Response(body=html, content_type="text/html")

    async def stats_route(request: web.Request) -> web.Response:
        return web.json_response({**stats, "time": time.time()})

    async def history_route(request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        return web.json_response({"interval_s": 1, "window_s": 900, "sampler_pid": 1,
                                  "points": [p for p in points if p["t"] > since]})

    app = web.Application()
    app.router.add_get("/dashboard", page_route)
    app.router.add_get("/dashboard/stats.json", stats_route)
    app.router.add_get("/dashboard/history.json", history_route)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with Browser(exe) as page:
            await page.size(1366, 768)
            await page.open(f"http://127.0.0.1:{port}/dashboard")
            await wait_for_render(page)
            depth = await chart(page, "chart-priority-depth")
            assert depth["points"] == 40  # zeros outside the backlog: one line, no gap
            assert depth["legend"] == ["interactive 0", "batch 0"]  # the latest second
            wait = await chart(page, "chart-priority-wait")
            assert wait["points"] == 20  # the seconds with calls; none drawn elsewhere
            assert wait["legend"] == ["interactive p50 4.0 ms", "interactive p99 20.0 ms",
                                      "batch p50 300 ms", "batch p99 900 ms",
                                      "in backend b1:8000 p99 2.0 ms"]
            assert wait["caption"].startswith("1,000 calls queued for a slot")
            limit = await chart(page, "chart-limit")
            assert limit["points"] == 40
            assert limit["legend"] == ["limit zone 6", "in flight zone 3"]
            # Hovering the backlog reads out both classes at that second.
            tip = await hover(page, "chart-priority-depth", 1 - 20 / 900)
            assert tip.split("\n")[1:] == ["interactive: 2", "batch: 7"], tip
            assert await page.evaluate(_OVERFLOW) == []
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "dashboard-scheduling.png").write_bytes(await page.screenshot())
    finally:
        await runner.cleanup()


async def check_takeover(base: str) -> None:
    """The sampling worker dies: another takes over and the history so far stays."""
    before = await get_json(f"{base}/dashboard/history.json")
    first, last, pid = before["points"][0]["t"], before["points"][-1]["t"], before["sampler_pid"]
    os.kill(pid, signal.SIGKILL)  # the kernel drops its flock; the supervisor starts another
    deadline = time.monotonic() + 60
    while True:
        try:
            after = await get_json(f"{base}/dashboard/history.json")
        except (aiohttp.ClientError, AssertionError):  # a connection the dying worker held
            after = before
        if after["sampler_pid"] != pid and after["points"][-1]["t"] > last + 2:
            break
        assert time.monotonic() < deadline, "no worker took over the sampling"
        await asyncio.sleep(0.5)
    assert after["points"][0]["t"] == first
    assert len(after["points"]) > len(before["points"])


async def wait_for_render(page: Browser, renders: int = 1) -> dict[str, str]:
    """The charts' data attributes once the page has drawn ``renders`` polls."""
    deadline = time.monotonic() + 60
    while True:
        charts: dict[str, str] = await page.evaluate(
            "Object.assign({}, (document.getElementById('charts') || {}).dataset || {})")
        if int(charts.get("renders", "0")) >= renders:
            return charts
        if time.monotonic() > deadline:
            pytest.fail(f"the page never rendered: {charts}")
        await asyncio.sleep(0.1)


async def test_history_json(aiohttp_client: Any, backend: BackendProc) -> None:
    """One worker: the history in memory, behind the admin token, ``since`` checked."""
    client = await ops_client(aiohttp_client, backend, admin_token=TOKEN)
    assert (await client.get("/dashboard/history.json")).status == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for bad in ("abc", "nan", "inf", ""):
        resp = await client.get("/dashboard/history.json", params={"since": bad}, headers=auth)
        assert resp.status == 422, bad
        error = (await resp.json())["error"]
        assert error["type"] == "invalid_request" and error["message"].startswith("since:")

    async def history(since: float = 0.0) -> Any:
        resp = await client.get("/dashboard/history.json", params={"since": str(since)},
                                headers=auth)
        assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
        return await resp.json()

    deadline = time.monotonic() + 30
    while not (await history())["points"]:  # the first point: the sampler has a baseline
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    await embed(client, ["history one", "history two"])
    await embed(client, ["history one"])
    while history_total((body := await history())["points"]) < 2:
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.2)
    assert body["interval_s"] == 1.0 and body["window_s"] == 900.0
    assert body["sampler_pid"] == os.getpid()
    points = body["points"]
    assert sum(p["requests"].get("MISS", 0) for p in points) == 1
    assert sum(p["requests"].get("HIT", 0) for p in points) == 1
    assert sum(p["items"].get("hit", 0) for p in points) == 1
    assert [p["t"] for p in points] == sorted(p["t"] for p in points)
    newest = points[-1]["t"]
    assert all(p["t"] > newest for p in (await history(newest))["points"])
