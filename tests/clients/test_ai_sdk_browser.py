"""A `useChat` page (React, @ai-sdk/react, bundled by esbuild when the test runs) in headless Chromium against a real server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.browser_kit import chromium, console_errors, screenshot, wait_for
from tests.clients.conftest import KEY_A
from tests.clients.page_proxy import serve_page
from tests.helpers.api_server import ApiServer
from tests.helpers.node import run_node

pytestmark = pytest.mark.integration


@pytest.fixture
def page(clients: Path, server: ApiServer, tmp_path: Path) -> Iterator[str]:
    """The page built into a folder of this test and served with the API on one origin."""
    built = run_node(clients, "build_page.mjs", [str(tmp_path / "page")])
    assert built.returncode == 0, built.stderr
    with serve_page(tmp_path / "page", server.url) as url:
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
