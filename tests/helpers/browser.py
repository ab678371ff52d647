"""Drive a real headless Chromium through the DevTools protocol (helper, not a test module).

``Browser(path)`` starts Chromium with a DevTools port, ``page.open(url)`` loads a page and
waits for its load event, ``page.js(expr)`` evaluates JavaScript (``frame=`` an iframe's
index: evaluated inside it, even for a cross-origin data: frame, as DevTools allows), and
``page.wait_for(expr)`` waits until a JavaScript expression is truthy (a DOM node shown, an
image decoded), and ``page.screenshot(path)`` writes a PNG. aiohttp (a Snakemake dependency)
speaks the websocket; no browser-automation package is needed.

Chromium runs in its own process group (a new session), and ``close()`` kills the group as
one, renderers and GPU/zygote helpers included, then waits until none is left.

``find_chromium()`` returns the executable, installing Debian's ``chromium`` as root when it
is missing (``python tests/helpers/browser.py --install`` does only that, for CI's set-up step).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

if not __package__:  # run as a script (python tests/helpers/browser.py): the helpers package is one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import procs  # noqa: E402


class Browser:
    def __init__(self, executable: str, width: int = 1400, height: int = 1000):
        self.profile = Path(tempfile.mkdtemp(prefix="mor-chromium-"))
        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--window-size={width},{height}", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             "--disable-breakpad", "--disable-crash-reporter", "--no-first-run", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            # its config and caches in the profile, not ~/.config/chromium (crash reports)
            env=dict(os.environ, XDG_CONFIG_HOME=str(self.profile / "config"), XDG_CACHE_HOME=str(self.profile / "cache")))
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])

    def close(self) -> None:
        """Kill Chromium's whole process group and wait until no member is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        deadline = time.monotonic() + 60
        while procs.members("pgrp", self.proc.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"chromium's processes {procs.members('pgrp', self.proc.pid)} outlived SIGKILL")
            time.sleep(0.05)
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


def find_chromium() -> str:
    """The chromium executable; as root, ``apt-get install chromium`` first when it is missing.
    Raises RuntimeError saying why when there is none and it cannot be installed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("chromium is not installed and this is not root (apt-get install chromium)")

    def install() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
                              capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)

    proc = install()
    if proc.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=900, stdin=subprocess.DEVNULL)
        proc = install()
    if proc.returncode != 0 or not shutil.which("chromium"):
        raise RuntimeError(f"apt-get install chromium failed: {(proc.stdout + proc.stderr)[-800:]}")
    return shutil.which("chromium")


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

    async def open(self, url: str, ready: str = "document.readyState == 'complete'", within_s: float = 60) -> None:
        """Navigate, wait for the load event, then until the JavaScript ``ready`` is truthy."""
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        self.events.clear()
        await self.send("Page.navigate", url=url)
        deadline = time.monotonic() + within_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load within {within_s:.0f}s")
            await asyncio.sleep(0.05)
        await self.wait_for(ready, within_s=within_s)

    async def wait_for(self, expression: str, frame: int | None = None, within_s: float = 60):
        """Evaluate ``expression`` until it is truthy and return its value. The deadline only
        bounds a hang (a page that never shows what is waited for); it is not a timing."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                value = await self.js(expression, frame=frame)
            except (RuntimeError, IndexError, KeyError):  # the node or frame is not there yet
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true within {within_s:.0f}s: {expression[:200]}")
            await asyncio.sleep(0.05)

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


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python tests/helpers/browser.py --install")
    print(find_chromium())
