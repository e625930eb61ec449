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
            assert text["reserved"] == 4
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
