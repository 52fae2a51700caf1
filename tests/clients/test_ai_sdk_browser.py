"""A `useChat` page (React, @ai-sdk/react, bundled by esbuild when the test runs) in headless Chromium against a real server.

The page is bundled with `ai` 7 (the `clients` project) or with `ai` 6 and `@ai-sdk/react` 3
(the `ai_sdk_6` project: what `npm install ai @ai-sdk/react` gives on Node.js 20).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.browser.browser_kit import chromium, console_errors, screenshot, wait_for
from tests.clients.conftest import KEY_A
from tests.clients.page_proxy import serve_page
from tests.helpers.api_server import ApiServer
from tests.helpers.node import run_node

pytestmark = pytest.mark.integration


@contextmanager
def _built_page(clients: Path, server: ApiServer, folder: Path, packages: Path | None = None) -> Iterator[str]:
    """The page bundled (with the packages of `packages`, else of `clients`) and served with the API on one origin."""
    built = run_node(clients, "build_page.mjs", [str(folder), *([str(packages)] if packages else [])])
    assert built.returncode == 0, built.stderr
    with serve_page(folder, server.url) as url:
        yield url


@pytest.fixture
def page(clients: Path, server: ApiServer, tmp_path: Path) -> Iterator[str]:
    """The page (with `ai` 7) built into a folder of this test and served with the API on one origin."""
    with _built_page(clients, server, tmp_path / "page") as url:
        yield url


@pytest.fixture
def page_ai_sdk_6(clients: Path, ai_sdk_6: Path, server: ApiServer, tmp_path: Path) -> Iterator[str]:
    """The same page bundled with `ai` 6 and `@ai-sdk/react` 3."""
    with _built_page(clients, server, tmp_path / "page", ai_sdk_6) as url:
        yield url


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def _assistant_text(browser: WebDriver) -> str:
    found = browser.find_elements(By.CSS_SELECTOR, "#messages li.assistant")
    return found[-1].text if found else ""


def _streaming(text: str) -> str | None:
    """The answer's text while it is still coming in (some words shown, not the last)."""
    return text if "word2" in text and "word16" not in text else None


def _send(browser: WebDriver, text: str) -> None:
    wait_for(lambda: browser.find_element(By.ID, "send").is_enabled(), message="the send button")
    browser.find_element(By.ID, "input").send_keys(text)
    browser.find_element(By.ID, "send").click()


def test_send_watch_tokens_arrive_approve_and_see_the_answer_complete(browser: WebDriver, page: str) -> None:
    browser.get(f"{page}/index.html?key={KEY_A}&chat=page-{uuid.uuid4().hex[:8]}")
    # Send: the answer appears word by word (some text shows before the whole answer)
    _send(browser, "story 16")
    partial: str = wait_for(lambda: _streaming(_assistant_text(browser)), 20, "the first tokens")
    assert "word1 word2" in partial
    words = " ".join(f"word{n}" for n in range(1, 17))
    wait_for(lambda: words in _assistant_text(browser), 30, "the whole story")
    # A call that needs approval: the card shows, the user approves, the answer completes
    _send(browser, "deploy billing")
    approve = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), 20, "the approval card")
    screenshot(browser, "ai_sdk_chat_waiting_for_approval")
    approve[0].click()
    wait_for(lambda: "deployed billing" in _assistant_text(browser).split("\n")[-1], 20, "the answer after approval")
    wait_for(lambda: browser.find_element(By.ID, "status").text == "ready", 20, "the chat to be ready")
    last = browser.find_elements(By.CSS_SELECTOR, "#messages li.assistant")[-1]
    assert last.get_attribute("data-status") == "COMPLETED"
    assert last.find_element(By.CSS_SELECTOR, ".tool").get_attribute("data-state") == "output-available"
    screenshot(browser, "ai_sdk_chat_answered")
    assert console_errors(browser) == []


def _last_assistant(browser: WebDriver) -> WebElement:
    return browser.find_elements(By.CSS_SELECTOR, "#messages li.assistant")[-1]


def test_ai_sdk_6_on_node_20_approves_and_rejects_and_shows_each_answer(browser: WebDriver, page_ai_sdk_6: str) -> None:
    # Given the page bundled with what `npm install ai @ai-sdk/react` gives on Node.js 20
    browser.get(f"{page_ai_sdk_6}/index.html?key={KEY_A}&chat=page6-{uuid.uuid4().hex[:8]}")
    # When a call is approved, then the turn completes and the page shows its answer
    _send(browser, "deploy billing")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), 20, "the approval card")[0].click()
    wait_for(lambda: "deployed billing" in _assistant_text(browser).split("\n")[-1], 20, "the answer after approval")
    wait_for(lambda: browser.find_element(By.ID, "status").text == "ready", 20, "the chat to be ready")
    assert _last_assistant(browser).get_attribute("data-status") == "COMPLETED"
    assert _last_assistant(browser).find_element(By.CSS_SELECTOR, ".tool").get_attribute("data-state") == (
        "output-available"
    )
    # When another is rejected, then the model's answer reads the reason and the call shows as denied
    _send(browser, "deploy search")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button.reject"), 20, "the second approval card")[0].click()
    wait_for(lambda: "not deployed" in _assistant_text(browser), 20, "the answer after the rejection")
    wait_for(lambda: browser.find_element(By.ID, "status").text == "ready", 20, "the chat to be ready")
    last = _last_assistant(browser)
    assert last.get_attribute("data-status") == "COMPLETED"
    assert last.find_element(By.CSS_SELECTOR, ".tool").get_attribute("data-state") == "output-denied"
    assert "not deployed: The user rejected this tool call: no" in last.text
    screenshot(browser, "ai_sdk_6_chat_approved_and_rejected")
    assert browser.find_elements(By.ID, "error") == []
    assert console_errors(browser) == []


@pytest.fixture(params=["ai-7", "ai-6"])
def page_of_each_version(
    request: pytest.FixtureRequest, clients: Path, server: ApiServer, tmp_path: Path
) -> Iterator[str]:
    """The page bundled with `ai` 7, then with `ai` 6."""
    packages = request.getfixturevalue("ai_sdk_6") if request.param == "ai-6" else None
    with _built_page(clients, server, tmp_path / "page", packages) as url:
        yield url


def _ready(browser: WebDriver) -> None:
    wait_for(lambda: browser.find_element(By.ID, "status").text == "ready", 20, "the chat to be ready")


def _roles(browser: WebDriver) -> list[str]:
    return [li.get_attribute("class") or "" for li in browser.find_elements(By.CSS_SELECTOR, "#messages li")]


def test_a_reloaded_page_shows_the_finished_conversation_from_the_messages_route(
    browser: WebDriver, page_of_each_version: str, request: pytest.FixtureRequest
) -> None:
    version = request.node.callspec.params["page_of_each_version"]
    # Given a chat whose turn has finished
    browser.get(f"{page_of_each_version}/index.html?key={KEY_A}&chat=reload-{uuid.uuid4().hex[:8]}")
    _send(browser, "hello reload")
    wait_for(lambda: "Hello! You said reload." in _assistant_text(browser), 20, "the answer")
    _ready(browser)
    # When the page reloads (it fetches the messages, then `useChat({id, messages, resume: true})`)
    browser.refresh()
    wait_for(lambda: "Hello! You said reload." in _assistant_text(browser), 20, "the answer after the reload")
    _ready(browser)
    # Then it shows the user's message and the answer, once each
    assert _roles(browser) == ["user", "assistant"]
    assert "hello reload" in browser.find_element(By.CSS_SELECTOR, "#messages li.user").text
    screenshot(browser, f"ai_sdk_chat_reloaded_{version}")
    assert browser.find_elements(By.ID, "error") == []
    assert console_errors(browser) == []


def test_a_page_reloaded_while_an_approval_waits_shows_it_once_and_the_approval_completes_the_turn(
    browser: WebDriver, page_of_each_version: str, request: pytest.FixtureRequest
) -> None:
    version = request.node.callspec.params["page_of_each_version"]
    # Given a chat whose turn waits for approval
    browser.get(f"{page_of_each_version}/index.html?key={KEY_A}&chat=reload-wait-{uuid.uuid4().hex[:8]}")
    _send(browser, "deploy payroll")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), 20, "the approval card")
    # When the page reloads: the messages route shows the waiting call, the resumed stream replays its turn
    browser.refresh()
    _ready(browser)
    approve = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), 20, "the card after the reload"
    )
    # Then the turn's message is shown once (the replay replaced it, as their ids match)
    assert _roles(browser) == ["user", "assistant"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#messages .tool")) == 1
    screenshot(browser, f"ai_sdk_chat_reloaded_waiting_{version}")
    # And approving it there completes the turn, in the same message
    approve[0].click()
    wait_for(lambda: "deployed payroll" in _assistant_text(browser).split("\n")[-1], 20, "the answer after approval")
    _ready(browser)
    assert _roles(browser) == ["user", "assistant"]
    assert browser.find_element(By.CSS_SELECTOR, "#messages .tool").get_attribute("data-state") == "output-available"
    assert browser.find_elements(By.ID, "error") == []
    assert console_errors(browser) == []
