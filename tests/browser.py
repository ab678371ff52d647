"""Drive a real headless Chromium through the DevTools protocol (helper, not a test module).

``Browser(path)`` starts Chromium with a DevTools port, ``page.open(url)`` loads a page and
waits for its load event, ``page.js(expr)`` evaluates JavaScript (``frame=`` an iframe's
index: evaluated inside it, even for a cross-origin data: frame, as DevTools allows), and
``page.screenshot(path)`` writes a PNG. aiohttp (a Snakemake dependency) speaks the
websocket; no browser-automation package is needed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp


class Browser:
    def __init__(self, executable: str, width: int = 1400, height: int = 1000):
        self.profile = Path(tempfile.mkdtemp(prefix="mor-chromium-"))
        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--window-size={width},{height}", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, script):
        """Run ``await script(page)`` against the browser's first page; returns its result."""
        return asyncio.run(self._run(script))

    async def _run(self, script):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                targets = await r.json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with http.ws_connect(url, max_msg_size=0) as ws:
                page = Page(ws)
                reader = asyncio.create_task(page.read())
                try:
                    return await script(page)
                finally:
                    reader.cancel()


class Page:
    def __init__(self, ws):
        self.ws, self.next_id, self.pending, self.events = ws, 0, {}, []

    async def read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def send(self, method: str, **params) -> dict:
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        data = await asyncio.wait_for(fut, 60)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return data["result"]

    async def open(self, url: str, settle_s: float = 1.0) -> None:
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        self.events.clear()
        await self.send("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load")
            await asyncio.sleep(0.1)
        await asyncio.sleep(settle_s)

    async def js(self, expression: str, frame: int | None = None):
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if frame is not None:
            tree = await self.send("Page.getFrameTree")
            child = tree["frameTree"]["childFrames"][frame]["frame"]["id"]
            world = await self.send("Page.createIsolatedWorld", frameId=child)
            params["contextId"] = world["executionContextId"]
        result = await self.send("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        data = await self.send("Page.captureScreenshot", format="png")
        Path(path).write_bytes(base64.b64decode(data["data"]))
        return Path(path)
