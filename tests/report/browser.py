"""Load a report in headless Chromium through the DevTools protocol and say what the browser saw.

Chromium is started with ``--remote-debugging-port=0`` (it picks a free port and writes it to
``DevToolsActivePort`` in its profile directory); one WebSocket to the browser, one page target
attached in flat mode.  Collected while the page loads and settles:

* console errors and warnings (``Runtime.consoleAPICalled``), uncaught exceptions
  (``Runtime.exceptionThrown``) and browser log errors (``Log.entryAdded``: a blocked or failed
  resource, a Content-Security-Policy violation);
* every network request whose URL is not the report itself or a ``data:`` URL.

Then a script run in the page counts what was drawn (charts, bars, points), and the page can be
captured as a full-height PNG.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)

# Run in the page after load: what a reader would see.
INSPECT = """JSON.stringify({
  title: document.title,
  charts: Array.from(document.querySelectorAll('svg.chart')).map(s => ({
    label: s.getAttribute('aria-label'),
    width: s.getBoundingClientRect().width, height: s.getBoundingClientRect().height,
    elements: s.querySelectorAll('rect,circle,polyline,path').length})),
  bars: Array.from(document.querySelectorAll('rect.bar')).map(b => b.getAttribute('class')),
  strips: document.querySelectorAll('rect.strip').length,
  points: document.querySelectorAll('circle.point').length,
  ooms: document.querySelectorAll('path.oom').length,
  traces: document.querySelectorAll('polyline.trace').length,
  titles: document.querySelectorAll('svg.chart title').length,
  scripts: document.scripts.length,
  sections: Array.from(document.querySelectorAll('h2')).map(h => h.id),
  tables: Array.from(document.querySelectorAll('table')).map(t => [t.className, t.rows.length]),
  text: document.body.innerText.slice(0, 200000)
})"""


def find_chromium() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


@dataclass
class PageReport:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dom: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes | None = None


class _Cdp:
    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        message_id = next(self.ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        for index, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(index)
        deadline = time.monotonic() + timeout
        while True:
            event = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if event.get("method") == method:
                return event
            self.events.append(event)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return


def load(html: Path, *, screenshot: bool = False, width: int = 1200, timeout: float = 90) -> PageReport:
    """Open ``html`` in a fresh headless Chromium and report what happened."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium binary on PATH")
    url = html.resolve().as_uri()
    # ignore_cleanup_errors: a straggling helper process may still write its last file into the
    # profile while the directory is removed (seen once in CI: "Directory not empty").
    with tempfile.TemporaryDirectory(prefix="report-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return _inspect(_devtools_url(Path(profile), proc, timeout), url, screenshot, width, timeout)
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop Chromium and every helper it started (renderer, zygote, crash handler): they share the
    session started for it, and any of them left running keeps writing into the profile."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait  # the leader is gone; give the rest of the group a moment
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _devtools_url(profile: Path, proc: subprocess.Popen, timeout: float) -> str:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while True:
        if marker.exists():
            lines = marker.read_text().split("\n")
            if len(lines) >= 2 and lines[1]:
                return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before opening DevTools")
        if time.monotonic() > deadline:
            raise TimeoutError("chromium did not open its DevTools port")
        time.sleep(0.05)


def _inspect(devtools: str, url: str, screenshot: bool, width: int, timeout: float) -> PageReport:
    from websockets.sync.client import connect

    with connect(devtools, max_size=None, open_timeout=30) as ws:
        cdp = _Cdp(ws)
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            cdp.call(f"{domain}.enable", session=session)
        cdp.call("Page.navigate", {"url": url}, session=session)
        cdp.wait_for("Page.loadEventFired", timeout)
        cdp.drain(0.5)  # late console messages and requests
        value = cdp.call("Runtime.evaluate", {"expression": INSPECT, "returnByValue": True}, session=session)
        report = PageReport(dom=json.loads(value["result"]["value"]))
        if screenshot:
            metrics = cdp.call("Page.getLayoutMetrics", session=session)
            height = int(metrics["cssContentSize"]["height"]) + 1
            shot = cdp.call(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
                },
                session=session,
            )
            report.screenshot = base64.b64decode(shot["data"])
        _collect(cdp.events, url, report)
        return report


def _collect(events: list[dict], url: str, report: PageReport) -> None:
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            report.console_errors.append(f"console.{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            report.console_errors.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            entry = params["entry"]
            report.console_errors.append(f"log {entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            requested = params.get("request", {}).get("url", "")
            if requested != url and not requested.startswith("data:"):
                report.requests.append(requested)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.report.browser REPORT.html [--screenshot OUT.png]``: what Chromium saw."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("html", type=Path)
    parser.add_argument("--screenshot", type=Path, help="write a full-page PNG here")
    parser.add_argument("--width", type=int, default=1200)
    args = parser.parse_args(argv)
    seen = load(args.html, screenshot=args.screenshot is not None, width=args.width)
    if args.screenshot is not None and seen.screenshot is not None:
        args.screenshot.write_bytes(seen.screenshot)
    charts = [c["label"] for c in seen.dom["charts"]]
    print(json.dumps({"console_errors": seen.console_errors, "requests": seen.requests, "charts": charts}, indent=1))
    return 1 if seen.console_errors or seen.requests else 0


if __name__ == "__main__":
    raise SystemExit(main())
