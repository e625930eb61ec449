"""Headless Chromium driven over the DevTools protocol, for the dashboard's browser tests.

No extra dependency: Chromium opens a WebSocket for the protocol (``--remote-debugging-port``)
and aiohttp speaks WebSocket. Enough of the protocol to size the window, load a page, run a
script in it and take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import re
import tempfile
from types import TracebackType
from typing import Any

import aiohttp

_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class Browser:
    """``async with Browser(path) as page: await page.call("Page.navigate", url=...)``."""

    def __init__(self, executable: str) -> None:
        self._exe = executable
        self._profile = tempfile.TemporaryDirectory(prefix="gw-cdp-")
        self._proc: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._id = 0

    async def __aenter__(self) -> Browser:
        self._proc = await asyncio.create_subprocess_exec(
            self._exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            f"--user-data-dir={self._profile.name}", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert self._proc.stderr is not None
        browser_ws = None
        async with asyncio.timeout(60):
            while browser_ws is None:
                line = await self._proc.stderr.readline()
                if not line:
                    raise RuntimeError("chromium exited before opening its DevTools socket")
                m = _LISTENING.search(line)
                if m:
                    browser_ws = m.group(1).decode()
        port = browser_ws.split(":")[2].split("/")[0]
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as reply:
            targets = await reply.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        self._profile.cleanup()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One protocol command; its result (events in between are skipped)."""
        assert self._ws is not None
        self._id += 1
        mine = self._id
        await self._ws.send_json({"id": mine, "method": method, "params": params})
        async with asyncio.timeout(90):
            while True:
                msg = await self._ws.receive_json()
                if msg.get("id") == mine:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    result: dict[str, Any] = msg.get("result", {})
                    return result

    async def size(self, width: int, height: int) -> None:
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=False)

    async def open(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (a promise is awaited)."""
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                                awaitPromise=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def screenshot(self) -> bytes:
        """A PNG of the whole page (beyond the window's height)."""
        size = (await self.call("Page.getLayoutMetrics"))["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        reply = await self.call("Page.captureScreenshot", format="png", clip=clip,
                                captureBeyondViewport=True)
        return base64.b64decode(reply["data"])
