"""A `useStream` page on another origin is reloaded mid-answer and rejoins the run (`reconnectOnMount`).

The page (tests/clients/langgraph/use_stream_page.jsx, bundled by esbuild) is served over
HTTP from an origin of its own, and the server lists that origin in
`AGENT_RUNNER_CORS_ORIGINS`: the browser's cross-origin rules are in force, so the page
learns the run id only if the server lets it read `Content-Location`, and rejoins the run
only if `Last-Event-ID: -1` means "from the start". It authenticates with a short-lived
token for one conversation (`Client({apiKey})` sends it as `x-api-key`). Embedded on
SQLite, and with a Celery worker on PostgreSQL and Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.browser_kit import chromium, console_errors, screenshot, serve_folder, wait_for
from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.node import npm_project, run_node
from tests.integration.api.api_server import api_on_celery
from tests.integration.langgraph.langgraph_agents import AGENTS, story

PROJECT = Path(__file__).resolve().parents[1] / "clients" / "langgraph"
KEY = "key-acme-use-stream-reload-0123456789"
SECRET = "use-stream-reload-secret-0123456789abcdef"
WORDS = 120
"""The answer streams for about six seconds: long enough to reload in the middle of it."""


@pytest.fixture(scope="module")
def page_origin() -> Iterator[tuple[str, Path]]:
    """The page, bundled now by esbuild, served from an origin of its own: (origin, page path)."""
    built = run_node(npm_project(PROJECT), "build_page.mjs")
    assert built.returncode == 0, built.stderr[-3000:]
    with serve_folder(PROJECT / "dist") as origin:
        yield origin, PROJECT / "dist" / "index.html"


@contextmanager
def _embedded(origin: str, workdir: Path) -> Iterator[ApiServer]:
    yield from running_server(
        AGENTS,
        workdir,
        AGENT_RUNNER_API_KEYS=f"acme:{KEY}",
        AGENT_RUNNER_TOKEN_SECRET=SECRET,
        AGENT_RUNNER_CORS_ORIGINS=origin,
    )


@contextmanager
def _on_celery(origin: str, workdir: Path, pg_url: str) -> Iterator[ApiServer]:
    with api_on_celery(
        pg_url,
        workdir,
        AGENTS,
        server_args=["--worker", "celery"],
        AGENT_RUNNER_API_KEYS=f"acme:{KEY}",
        AGENT_RUNNER_TOKEN_SECRET=SECRET,
        AGENT_RUNNER_CORS_ORIGINS=origin,
    ) as stack:
        yield stack.server


def _messages(browser: WebDriver) -> list[tuple[str, str]]:
    items = browser.find_elements(By.CSS_SELECTOR, "#messages li")
    return [(item.get_attribute("data-type") or "", item.text.split(" ", 1)[-1]) for item in items]


def _ai_text(browser: WebDriver) -> str:
    return next((text for kind, text in _messages(browser) if kind == "ai"), "")


@pytest.mark.parametrize("mode", ["embedded", "celery"])
def test_a_page_reloaded_mid_answer_rejoins_the_run_across_origins(
    mode: str, page_origin: tuple[str, Path], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    origin, _ = page_origin
    if mode == "embedded":
        running = _embedded(origin, tmp_path)
    else:
        running = _on_celery(origin, tmp_path, request.getfixturevalue("pg_url"))
    conversation = f"c-reload-{mode}"
    with running as server, chromium() as browser:
        assert origin != server.url
        minted = httpx.post(
            f"{server.url}/v1/tokens",
            json={"user": "u-reader", "conversation_id": conversation, "expires_in": 300},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert minted.status_code == 201, minted.text
        query = httpx.QueryParams({"api": server.url, "assistant": "writer", "apiKey": minted.json()["token"]})
        browser.get(f"{origin}/index.html?{query}")
        wait_for(lambda: browser.execute_script("return window.pageReady === true"), message="the page")
        # Given a user whose answer is streaming in (the thread is the token's conversation)
        browser.find_element(By.ID, "draft").send_keys(f"story {WORDS}")
        browser.find_element(By.ID, "send").click()
        final = story(WORDS)
        wait_for(lambda: 3 <= len(_ai_text(browser).split()) < WORDS // 2, timeout=30, message="a partial answer")
        # The page read the run id from Content-Location, and the thread id is in its address
        assert browser.execute_script("return window.createdRuns?.length") == 1
        assert f"thread={conversation}" in browser.current_url
        # When the page is reloaded in the middle of the answer
        browser.refresh()
        wait_for(lambda: browser.execute_script("return window.pageReady === true"), message="the reloaded page")
        # Then it shows the user's message and rejoins the run, to the whole answer, once
        wait_for(lambda: _ai_text(browser) == final, timeout=60, message="the whole answer after the reload")
        wait_for(lambda: browser.find_element(By.ID, "status").text == "idle", timeout=30, message="the run's end")
        assert _messages(browser) == [("human", f"story {WORDS}"), ("ai", final)]
        screenshot(browser, f"langgraph-use-stream-reload-{mode}")
        assert browser.find_elements(By.ID, "error") == []
        assert console_errors(browser) == []
