"""A team's page on another origin drives the API in headless Chromium with a short-lived token.

The page (served by the tests' static server, so its origin differs from the API's) starts
a turn with `fetch` (a preflighted POST with `Authorization`), follows its events with
`EventSource` and `?access_token=`, and approves the call a person is asked about. The
same page against a server that does not list its origin is refused by the browser, and
nothing reaches that server's store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.browser_kit import screenshot, wait_for
from tests.browser.console_server import ConsoleServer, serve
from tests.browser.static_server import StaticServer

KEY = "key-acme-cross-origin-0123456789"
SECRET = "cross-origin-test-secret-0123456789abcdef"
CONVERSATION = "c-deploys"


@pytest.fixture(scope="module")
def allowing(tmp_path_factory: pytest.TempPathFactory, static_server: StaticServer) -> Iterator[ConsoleServer]:
    """A server that lists the page's origin."""
    with serve(
        tmp_path_factory.mktemp("cors-allowing"),
        api_keys=f"acme:{KEY}",
        AGENT_RUNNER_TOKEN_SECRET=SECRET,
        AGENT_RUNNER_CORS_ORIGINS=static_server.url,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """A server without AGENT_RUNNER_CORS_ORIGINS."""
    with serve(
        tmp_path_factory.mktemp("cors-closed"), api_keys=f"acme:{KEY}", AGENT_RUNNER_TOKEN_SECRET=SECRET
    ) as running:
        yield running


def token_for(server: ConsoleServer, user: str) -> str:
    """What the team's backend does with its tenant key: mint a token for the signed-in user."""
    minted: dict[str, Any] = server.ok(
        "POST", "/v1/tokens", {"user": user, "conversation_id": CONVERSATION, "expires_in": 300}, key=KEY
    )
    return str(minted["token"])


def open_page(browser: WebDriver, static_server: StaticServer, server: ConsoleServer, token: str) -> None:
    query = httpx.QueryParams({"api": server.url, "token": token, "conversation": CONVERSATION})
    browser.set_window_size(1000, 760)
    browser.get("about:blank")  # a new hash alone would not load the page again
    browser.get(f"{static_server.url}/cross_origin.html#{query}")
    wait_for(lambda: browser.execute_script("return window.pageReady === true"), message="the page")


def page_state(browser: WebDriver) -> str:
    state: str = browser.execute_script("return document.getElementById('status').dataset.state")
    return state


def test_a_page_on_another_origin_starts_follows_and_approves_a_turn_with_a_token(
    browser: WebDriver, static_server: StaticServer, allowing: ConsoleServer
) -> None:
    # Given the page of a team's front end, with a token its backend minted
    assert static_server.url != allowing.url
    open_page(browser, static_server, allowing, token_for(allowing, "u-page-user"))
    # When it starts a turn and follows its events
    browser.execute_script("window.startTurn('deploy the billing service')")
    button = wait_for(lambda: browser.find_element(By.ID, "approve"), timeout=30, message="the approval card")
    screenshot(browser, "cross-origin-approval")
    # And the person approves the call on the page
    button.click()
    wait_for(lambda: page_state(browser) == "done", timeout=30, message="the end of the turn")
    screenshot(browser, "cross-origin-completed")
    # Then the answer arrived over the stream, and the store says who approved
    assert browser.find_element(By.ID, "answer").text == "billing deployed"
    assert browser.find_element(By.ID, "status").text == "turn COMPLETED"
    seen = [item.text for item in browser.find_elements(By.CSS_SELECTOR, "#events li")]
    assert seen[0] == "TURN_STARTED" and "TURN_SUSPENDED" in seen and seen[-1] == "TURN_COMPLETED"
    turn_id = browser.execute_script("return window.turnId")
    assert allowing.turn(turn_id, key=KEY)["status"] == "COMPLETED"
    timeline = allowing.ok("GET", f"/v1/conversations/{CONVERSATION}/messages", key=KEY)["items"]
    cards = [m for m in timeline if m["role"] == "agent_action"]
    assert [(c["status"], c["decided_by"]) for c in cards] == [("APPROVED", "u-page-user")]


def test_the_same_page_is_refused_by_a_server_that_does_not_list_its_origin(
    browser: WebDriver, static_server: StaticServer, closed: ConsoleServer, tmp_path: Path
) -> None:
    open_page(browser, static_server, closed, token_for(closed, "u-page-user"))
    browser.execute_script("window.startTurn('deploy the billing service')")
    wait_for(lambda: page_state(browser) == "refused", timeout=30, message="the browser's refusal")
    screenshot(browser, "cross-origin-refused")
    assert "Failed to fetch" in browser.find_element(By.ID, "status").text
    # The preflight was refused, so the POST never reached the server
    assert closed.ok("GET", "/v1/turns", key=KEY)["items"] == []
