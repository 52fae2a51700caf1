"""`/docs` renders in Chromium from the server's own assets: every resource the page loads is same-origin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.browser_kit import console_errors, screenshot, wait_for
from tests.browser.console_server import ConsoleServer, serve


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    with serve(tmp_path_factory.mktemp("docs-server")) as running:
        yield running


def test_swagger_ui_renders_from_the_servers_own_assets(browser: WebDriver, server: ConsoleServer) -> None:
    browser.set_window_size(1280, 900)
    browser.get(f"{server.url}/docs")
    title = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title"), message="Swagger UI")
    assert title.text.startswith("agent-runner")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".opblock-tag"), message="the operations")
    tags = {tag.get_attribute("data-tag") for tag in browser.find_elements(By.CSS_SELECTOR, ".opblock-tag")}
    assert {"turns", "events", "tokens"} <= tags
    screenshot(browser, "docs-offline", full_page=False)
    loaded: list[str] = browser.execute_script(
        "return performance.getEntriesByType('resource').map((entry) => entry.name)"
    )
    assert any(url.endswith("/docs-assets/swagger-ui-bundle.js") for url in loaded), loaded
    assert any(url.endswith("/docs-assets/swagger-ui.css") for url in loaded), loaded
    assert all(url.startswith(server.url + "/") for url in loaded), loaded
    assert console_errors(browser) == []
