"""A real headless Chromium for tests, driven over the DevTools protocol on a pipe (no extra packages).

`--remote-debugging-pipe` has Chromium read protocol messages from its fd 3 and write them to its
fd 4, each a JSON object ended by a NUL byte. `Browser` starts Debian's `chromium` with a fresh
profile, opens one page, and keeps every console error, uncaught exception and error log entry
(a failed load, a refused Content-Security-Policy) it reports, for a test to assert there were none.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    """The pipe's ends moved above 9, clear of the 3 and 4 the shell sets for Chromium."""
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved[0], moved[1]


def chromium_available() -> bool:
    return os.access(CHROMIUM, os.X_OK)


class Browser:
    """`with Browser() as page: page.goto(url); page.evaluate("document.title")`."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.errors: list[str] = []
        """Console errors, uncaught exceptions and error log entries, as text."""
        self._next_id = 0
        self._buffer = b""
        self._session: str | None = None
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="mcpmux-chromium-")
        to_browser, self._send_fd = _high(os.pipe())
        self._read_fd, from_browser = _high(os.pipe())
        command = " ".join([CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"])
        # fd 3 and 4 as Chromium expects them, set by the shell that becomes it (bash: dash takes fds < 10 only).
        self._process = subprocess.Popen(
            ["bash", "-c", f"exec {command} 3<&{to_browser} 4>&{from_browser} {to_browser}<&- {from_browser}>&-"],
            pass_fds=(to_browser, from_browser),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):  # it may close its pipe before answering
            self.send("Browser.close", session=False)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._send_fd)
        os.close(self._read_fd)
        shutil.rmtree(self._profile, ignore_errors=True)

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True) -> dict[str, Any]:
        """Send one command (to the page's session unless `session=False`) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self._session is not None:
            message["sessionId"] = self._session
        os.write(self._send_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self._note(reply)

    def goto(self, url: str) -> None:
        """Load `url` and wait for its load event."""
        self._events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_for_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll `expression` until it is truthy; its value. `TimeoutError` saying which it was."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            self._drain(0.2)
        raise TimeoutError(f"never true: {expression}")

    def wait_for_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for event in self._events:
                if event.get("method") == method:
                    self._events.remove(event)
                    return event
            self._note(self._read(deadline))

    def screenshot(self, path: str) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        with open(path, "wb") as out:
            out.write(base64.b64decode(data))

    def _drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                self._note(self._read(deadline))
            except TimeoutError:
                return

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read_fd], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._read_fd, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe (did it start?)")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def _note(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(arg.get("value", arg)) for arg in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            self.errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
        if method is not None and method.startswith("Page."):
            self._events.append(message)
