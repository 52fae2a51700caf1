"""An MCP server's two questions answered in the console's form cards, in headless Chromium.

The server (`agent-runner serve`, embedded) runs the agent of `tests.helpers.mcp_agents`,
whose toolset is a real MCP server process; each answer reaches that server on the
retried call, and it books once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.browser.browser_kit import console_errors, control, screenshot, wait_for
from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.mcp_agents import LOADER, URL_ENV, ask
from tests.helpers.mcp_server import DATES_FORM, DESTINATION_FORM, MCPServerProcess, running_mcp_server

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MCPServerProcess]:
    yield from running_mcp_server(tmp_path_factory.mktemp("mcp"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, mcp_server: MCPServerProcess) -> Iterator[ApiServer]:
    workdir = tmp_path_factory.mktemp("console-mcp")
    with contextmanager(running_server)(
        LOADER, workdir, f"sqlite:///{workdir / 'console.db'}", ["--worker", "embedded"], **{URL_ENV: mcp_server.url}
    ) as api:
        yield api


def pending_form(driver: WebDriver, title: str) -> WebElement:
    """The pending form card whose field is labelled `title`."""

    def find() -> WebElement | None:
        for found in driver.find_elements(By.CSS_SELECTOR, "li[data-role='agent_form'][data-status='PENDING']"):
            if found.find_elements(By.XPATH, f".//label[contains(normalize-space(), '{title}')]"):
                return found
        return None

    return wait_for(find, timeout=TIMEOUT, message=f"a pending form asking for {title}")


def test_the_console_answers_an_mcp_servers_two_questions_and_the_server_books_once(
    browser: WebDriver, server: ApiServer, mcp_server: MCPServerProcess
) -> None:
    conversation = f"c-mcp-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        created = client.post(
            "/v1/turns",
            json={"agent_id": "mcp-agent", "conversation_id": conversation, "input": ask("book_trip", traveller="ann")},
        ).json()
    browser.set_window_size(1280, 900)
    browser.get(f"{server.url}/#/conversations/{conversation}")

    # The server's first question shows as a form card with its message and its field
    first = pending_form(browser, DESTINATION_FORM["properties"]["city"]["title"])
    assert "Where to?" in first.text
    screenshot(browser, "console-mcp-question")
    control(first, "City").send_keys("Oslo")
    first.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    # The answer reached the server, which asked the second question on the same call
    second = pending_form(browser, DATES_FORM["properties"]["nights"]["title"])
    assert "How many nights in Oslo?" in second.text
    control(second, "Nights").send_keys("3")
    second.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    def completed() -> dict[str, object] | None:
        with server.client() as client:
            view: dict[str, object] = client.get(f"/v1/turns/{created['id']}").json()
        return view if view["status"] == "COMPLETED" else None

    view = wait_for(completed, timeout=TIMEOUT, message="the turn to complete")
    assert view["final_output"] == "done: booked 3 nights in Oslo for ann"
    wait_for(
        lambda: "booked 3 nights in Oslo" in browser.find_element(By.TAG_NAME, "main").text,
        timeout=TIMEOUT,
        message="the answer in the conversation",
    )
    screenshot(browser, "console-mcp-answered")
    assert mcp_server.bookings() == {f"{created['id']}:call-1": 1}
    assert console_errors(browser) == []
