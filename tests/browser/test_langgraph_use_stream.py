"""A page built on the React `useStream` hook of `@langchain/langgraph-sdk`, in headless Chromium, against a real server.

The page (tests/clients/langgraph/use_stream_page.jsx) is bundled at test time by esbuild
from npm and opened from a file. The server does not answer CORS preflights here, so this
one browser runs without the same-origin policy (`--disable-web-security`): what is under
test is the hook talking to the LangGraph API, not the browser's cross-origin rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.browser.browser_kit import chromium, console_errors, screenshot, wait_for
from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.node import npm_project, run_node
from tests.integration.langgraph.langgraph_agents import AGENTS, story

PROJECT = Path(__file__).resolve().parents[1] / "clients" / "langgraph"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    yield from running_server(AGENTS, tmp_path_factory.mktemp("use-stream"))


@pytest.fixture(scope="module")
def page() -> Path:
    """The page, bundled now by esbuild."""
    built = run_node(npm_project(PROJECT), "build_page.mjs")
    assert built.returncode == 0, built.stderr[-3000:]
    return PROJECT / "dist" / "index.html"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium(flags=["--disable-web-security", "--allow-file-access-from-files"]) as driver:
        yield driver


def _open(browser: WebDriver, page: Path, server: ApiServer, assistant: str) -> None:
    browser.get(f"{page.as_uri()}?api={server.url}&assistant={assistant}")
    wait_for(lambda: browser.execute_script("return window.pageReady === true"), message="the page")


def _messages(browser: WebDriver) -> list[tuple[str, str]]:
    items = browser.find_elements(By.CSS_SELECTOR, "#messages li")
    return [(item.get_attribute("data-type") or "", item.text.split(" ", 1)[-1]) for item in items]


def _send(browser: WebDriver, text: str) -> None:
    browser.find_element(By.ID, "draft").send_keys(text)
    browser.find_element(By.ID, "send").click()


def test_use_stream_shows_tokens_as_they_stream(browser: WebDriver, page: Path, server: ApiServer) -> None:
    _open(browser, page, server, "writer")
    # When the user sends a message
    _send(browser, "story 60")
    # Then the answer grows token by token while the run streams, then is whole
    final = story(60)

    def partial() -> str | None:
        found = [text for kind, text in _messages(browser) if kind == "ai"]
        return found[0] if found and found[0] != final and final.startswith(found[0]) else None

    wait_for(partial, timeout=30, message="a partly streamed answer")
    wait_for(lambda: ("ai", final) in _messages(browser), timeout=30, message="the whole answer")
    wait_for(lambda: browser.find_element(By.ID, "status").text == "idle", message="the run to end")
    assert _messages(browser) == [("human", "story 60"), ("ai", final)]
    screenshot(browser, "langgraph-use-stream-tokens")
    assert console_errors(browser) == []


def test_use_stream_renders_form_and_approval_interrupts_and_resumes_them(
    browser: WebDriver, page: Path, server: ApiServer
) -> None:
    _open(browser, page, server, "desk")
    _send(browser, "ticket for the vpn")
    # The form interrupt comes with its frozen schema: the page renders a field per property
    form = wait_for(lambda: browser.find_element(By.ID, "form-card"), timeout=30, message="the form card")
    form.find_element(By.NAME, "system").send_keys("vpn")
    Select(form.find_element(By.NAME, "scope")).select_by_value("ALL_USERS")
    screenshot(browser, "langgraph-use-stream-form")
    browser.find_element(By.ID, "form-submit").click()
    # Then the approval card shows the call with its sensitive argument masked
    card = wait_for(lambda: browser.find_element(By.ID, "approval-card"), timeout=30, message="the approval card")
    assert '"api_token":"***"' in card.find_element(By.ID, "approval-args").text
    screenshot(browser, "langgraph-use-stream-approval")
    browser.find_element(By.ID, "decision-approve").click()
    wait_for(
        lambda: ("ai", "opened TICKET-vpn-ALL_USERS") in _messages(browser), timeout=30, message="the final answer"
    )
    screenshot(browser, "langgraph-use-stream-done")
    assert console_errors(browser) == []
