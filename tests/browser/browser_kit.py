"""Headless Chromium (Debian's `chromium` and `chromium-driver`) driven by Selenium, and what the tests do with it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.helpers.http_server import serving

CHROMIUM = os.environ.get("AGENT_RUNNER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AGENT_RUNNER_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("AGENT_RUNNER_BROWSER_ARTIFACTS", Path(__file__).parent / "artifacts"))

# Flags that keep Chromium off the network (closed here) and fit a container.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

T = TypeVar("T")


class BrowserMissing(RuntimeError):
    """Chromium or its driver is not installed (`make browser-deps` installs them)."""


@contextmanager
def chromium(width: int = 1280, height: int = 900, flags: Sequence[str] = ()) -> Iterator[WebDriver]:
    """Start a headless Chromium with a fresh profile (and `flags` besides the usual ones); quit it on exit."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise BrowserMissing(
                f"{path} not found: run `make browser-deps` (apt-get install chromium chromium-driver)"
            )
    profile = tempfile.mkdtemp(prefix="agent-runner-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, *flags):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(condition: Callable[[], T | None], timeout: float = 10.0, message: str = "condition") -> T:
    """Poll `condition` until it returns a truthy value; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as error:  # a stale element while the page redraws: try again
            last_error = error
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {message}" + (f" (last error: {last_error!r})" if last_error else "")
            )
        time.sleep(0.05)


def screenshot(driver: WebDriver, name: str, *, full_page: bool = True) -> Path:
    """Save a PNG of the page under the artifacts folder and return its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    if full_page:
        metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = dict(metrics.get("cssContentSize") or metrics["contentSize"])
        # Capturing beyond the viewport lays the page out without the vertical scrollbar,
        # so the page is as wide as the window then, not as the content was measured.
        size["width"] = max(size["width"], driver.execute_script("return window.innerWidth"))
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            },
        )
        path.write_bytes(base64.b64decode(shot["data"]))
    else:
        driver.save_screenshot(str(path))
    return path


def console_errors(driver: WebDriver) -> list[str]:
    """Severe messages of the browser console: script errors and failed module loads.

    HTTP error answers the page expects and handles (a 422 with field errors, a 401 that
    opens the sign-in box) are logged by Chromium as network messages; those are left out.
    """
    return [
        entry["message"]
        for entry in driver.get_log("browser")  # type: ignore[attr-defined]
        if entry.get("level") == "SEVERE" and entry.get("source") != "network"
    ]


def js(driver: WebDriver, script: str, *args: Any) -> Any:
    """Run a script in the page and return its JSON-decoded result (`script` must `return` JSON)."""
    return json.loads(driver.execute_script(script, *args))


def describedby(driver: WebDriver, element: WebElement) -> list[WebElement]:
    """The elements an element's aria-describedby points at."""
    ids = (element.get_attribute("aria-describedby") or "").split()
    return [driver.find_element("id", i) for i in ids]


def control(scope: WebDriver | WebElement, label: str) -> WebElement:
    """The input, select or textarea whose label reads `label` (required mark aside)."""
    labels = scope.find_elements(By.XPATH, f".//label[.//span[@class='label-text' and normalize-space()='{label}']]")
    assert len(labels) == 1, f"expected one label {label!r}, found {len(labels)}"
    target = labels[0].get_attribute("for")
    assert target, f"label {label!r} is not bound to a control"
    return scope.find_element(By.ID, target)


def group(scope: WebDriver | WebElement, legend: str) -> WebElement:
    """The fieldset whose legend reads `legend`."""
    found = scope.find_elements(
        By.XPATH, f".//fieldset[legend/span[@class='label-text' and normalize-space()='{legend}']]"
    )
    assert len(found) == 1, f"expected one fieldset {legend!r}, found {len(found)}"
    return found[0]


def retype(element: WebElement, text: str) -> None:
    element.clear()
    element.send_keys(text)


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def serve_folder(folder: Path) -> Iterator[str]:
    """Serve the files of `folder` on a free loopback port (an origin of its own) until the block ends; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietFiles, directory=str(folder)))
    server.daemon_threads = True
    with serving(server, "page-files") as url:
        yield url
