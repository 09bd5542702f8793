"""A real JupyterLab server, opened in headless Chromium and driven through the DevTools protocol:
what a person sees of a notebook run in the browser (tests/test_notebook.py)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

WAIT = 180.0  # seconds for the page, its kernel and its cells


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(check: Callable[[], Any], what: str, deadline: float) -> Any:
    while True:
        try:
            found = check()
            if found:
                return found
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def run_all_in_jupyterlab(folder: Path, notebook: str, chromium: str, env: dict[str, str], done: str,
                          screenshot: Path | None = None) -> tuple[str, int]:
    """Open ``folder/notebook`` in JupyterLab in headless Chromium, run all its cells (Run > Run All
    Cells) and wait until the page's outputs show ``done``; the outputs' text as the page shows it, and
    how many rank groups (``details``) they hold. ``screenshot``: the page, as a PNG, there."""
    port, devtools, token = _free_port(), _free_port(), secrets.token_hex(16)
    settings = folder / ".jupyterlab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
         "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={folder / '.jupyterlab-settings'}"],
        env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    browser = None
    deadline = time.monotonic() + WAIT
    try:
        _until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2),
               "JupyterLab's server", deadline)
        browser = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={devtools}",
             f"--user-data-dir={folder / '.chromium'}", "--window-size=1200,900",
             f"http://127.0.0.1:{port}/lab/tree/{notebook}?token={token}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        pages = f"http://127.0.0.1:{devtools}/json"
        page = _until(lambda: next((p for p in json.load(urllib.request.urlopen(pages, timeout=2))
                                    if p["type"] == "page"), None), "Chromium's page", deadline)
        return IOLoop.current().run_sync(lambda: _drive(page["webSocketDebuggerUrl"], done, screenshot, deadline),
                                         timeout=WAIT + 30)
    finally:
        for process in (browser, server):
            if process is not None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


async def _drive(url: str, done: str, screenshot: Path | None, deadline: float) -> tuple[str, int]:
    connection = await websocket_connect(url, max_message_size=64 << 20)
    calls = 0

    async def call(method: str, **params: Any) -> Any:
        nonlocal calls
        calls += 1
        await connection.write_message(json.dumps({"id": calls, "method": method, "params": params}))
        while True:
            message = json.loads(await connection.read_message())
            if message.get("id") == calls:
                return message.get("result", {})

    async def page(expression: str) -> Any:
        said = await call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        return said.get("result", {}).get("value")

    async def until(expression: str, what: str) -> Any:
        while not (found := await page(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            await asyncio.sleep(0.3)
        return found

    await until("!!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))", "the notebook's page")
    await until("(() => { const w = jupyterapp.shell.currentWidget; const k = w && w.sessionContext && "
                "w.sessionContext.session && w.sessionContext.session.kernel; return !!k && k.status === 'idle'; })()",
                "the notebook's kernel")
    await page("jupyterapp.commands.execute('notebook:run-all-cells')")
    outputs = "Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText).join('\\n')"
    await until(f"({outputs}).includes({json.dumps(done)})", f"{done!r} on the page")
    text = await page(outputs)
    groups = await page("document.querySelectorAll('.jp-OutputArea-output details').length")
    if screenshot is not None:
        shot = await call("Page.captureScreenshot", format="png")
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    connection.close()
    return str(text), int(groups)
