from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.browser_kit import chromium, console_errors, wait_for
from tests.browser.static_server import StaticServer, serve_static


@pytest.fixture(scope="session")
def static_server() -> Iterator[StaticServer]:
    with serve_static() as server:
        yield server


@pytest.fixture(scope="session")
def static_url(static_server: StaticServer) -> str:
    return static_server.url


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def form_page(browser: WebDriver, static_url: str) -> Iterator[WebDriver]:
    """The renderer's test page, freshly loaded; the test fails on any script error in the page."""
    browser.set_window_size(1280, 900)
    browser.get(f"{static_url}/form.html")
    wait_for(lambda: browser.execute_script("return window.harnessReady === true"), message="form test page")
    yield browser
    assert console_errors(browser) == []
