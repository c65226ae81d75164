"""A headless Chromium driven over the DevTools protocol on a pipe, for the report's browser tests
and its benchmark (docs/report.md, "Tests")."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)


class BrowserError(Exception):
    pass


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclasses.dataclass
class PageLoad:
    """What a page did while it loaded."""

    console_errors: list[str] = dataclasses.field(default_factory=list)
    requests: list[str] = dataclasses.field(default_factory=list)  # every URL it asked for


class Browser:
    """One browser process; `open_page` loads a file in a fresh tab."""

    def __init__(self, executable: str, width: int = 1280, height: int = 1000) -> None:
        self._profile = tempfile.mkdtemp(prefix="codeclog-chromium-")
        self._size = (width, height)
        to_browser, self._out = os.pipe()
        self._in, from_browser = os.pipe()
        self._process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: _pipe_fds(to_browser, from_browser),
            close_fds=False,  # else fds 3 and 4 are closed after preexec_fn; Python's own
            # descriptors are not inheritable, so nothing else leaks into the browser
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close")
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._out)
        os.close(self._in)
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- the protocol ---------------------------------------------------------------------------

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive(30.0)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self._events.append(reply)

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError("the browser closed the pipe")
            self._buffer += chunk
        frame, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(frame)
        return message

    def _drain(self, session: str) -> Iterator[dict[str, Any]]:
        events, self._events = self._events, []
        for event in events:
            if event.get("sessionId") == session:
                yield event

    # -- pages ----------------------------------------------------------------------------------

    def open_page(self, path: Path, ready: str, timeout_s: float = 30.0) -> Page:
        """Load `path` in a new tab and wait until the JavaScript `ready` is true."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable", session=session)
        width, height = self._size
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        page = Page(self, session, target)
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session)
        deadline = time.monotonic() + timeout_s
        while not page.evaluate(
            f"(() => {{ try {{ return Boolean({ready}); }} catch (e) {{ return false; }} }})()"
        ):
            if time.monotonic() > deadline:
                page.collect()
                raise BrowserError(f"{path} was not ready in {timeout_s:.0f} s: {page.load}")
            time.sleep(0.05)
        page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        page.collect()
        return page


class Page:
    def __init__(self, browser: Browser, session: str, target: str) -> None:
        self._browser = browser
        self._session = session
        self._target = target
        self.load = PageLoad()

    def evaluate(self, expression: str) -> Any:
        result = self._browser.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            self._session,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def move_mouse(self, x: float, y: float) -> None:
        """Move the mouse to (x, y) in the viewport, as a user's hand would (hover)."""
        self._browser.call(
            "Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, self._session
        )

    def screenshot(self, full_page: bool = False) -> bytes:
        """A PNG of the viewport, or of the whole page."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.body.scrollWidth, document.body.scrollHeight]")
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        shot = self._browser.call("Page.captureScreenshot", params, self._session)
        return base64.b64decode(shot["data"])

    def collect(self) -> PageLoad:
        """Fold the events received so far into `load`."""
        for event in self._browser._drain(self._session):
            _note(self.load, event.get("method", ""), event.get("params", {}))
        return self.load

    def close(self) -> None:
        self._browser.call("Target.closeTarget", {"targetId": self._target})


def _note(load: PageLoad, method: str, params: dict[str, Any]) -> None:
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"])
        load.console_errors.append(f"console.{params['type']}: {text}")
    elif method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        description = details.get("exception", {}).get("description", details.get("text"))
        load.console_errors.append(f"uncaught: {description}")
    elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        load.console_errors.append(f"log: {params['entry'].get('text')}")
    elif method == "Network.requestWillBeSent":
        load.requests.append(params["request"]["url"])


def _pipe_fds(to_browser: int, from_browser: int) -> None:
    """In the child: the browser reads commands on fd 3 and writes replies on fd 4. The pipes
    are duplicated first: dup2 onto the same number would keep them close-on-exec."""
    read_end, write_end = os.dup(to_browser), os.dup(from_browser)
    os.dup2(read_end, 3)
    os.dup2(write_end, 4)
