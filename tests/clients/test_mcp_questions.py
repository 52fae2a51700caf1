"""An MCP server's questions (form and URL elicitations) answered through the AI SDK's chat and AG-UI's `HttpAgent`.

The agent's toolset is a real MCP server process (`tests.helpers.mcp_server`); each answer
reaches the server on the retried call, and the server books once.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clients.ag_ui_events import valid
from tests.clients.conftest import API_KEYS, KEY_A
from tests.clients.node_flows import run_flow
from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.mcp_agents import LOADER, URL_ENV
from tests.helpers.mcp_server import DATES_FORM, DESTINATION_FORM, MCPServerProcess, running_mcp_server
from tests.helpers.node import json_lines

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MCPServerProcess]:
    yield from running_mcp_server(tmp_path_factory.mktemp("mcp"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, mcp_server: MCPServerProcess) -> Iterator[ApiServer]:
    env = {"AGENT_RUNNER_API_KEYS": API_KEYS, URL_ENV: mcp_server.url}
    yield from running_server(LOADER, tmp_path_factory.mktemp("api"), None, None, **env)


def flow(clients: Path, server: ApiServer, name: str) -> list[dict[str, Any]]:
    return run_flow(clients, server, "mcp_flows.mjs", name, KEY_A)


@pytest.fixture(scope="module")
def ai_6_scripts(clients: Path, ai_sdk_6: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The flow scripts beside the packages of `ai` 6 (what `npm install ai` gives on Node.js 20)."""
    folder = tmp_path_factory.mktemp("ai6")
    (folder / "node_modules").symlink_to(ai_sdk_6 / "node_modules")
    for script in ("mcp_flows.mjs", "chat.mjs"):
        shutil.copy(clients / script, folder / script)
    return folder


def flow_on_ai_6(scripts: Path, server: ApiServer, name: str) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node is not None, "the client-protocol tests need Node.js 20"
    done = subprocess.run(
        [node, "mcp_flows.mjs", name, server.url, KEY_A], cwd=scripts, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:] + server.output()
    return json_lines(done.stdout)


def _turn_of(view: dict[str, Any]) -> str:
    turn_id = view["metadata"]["turnId"]
    assert isinstance(turn_id, str)
    return turn_id


@pytest.mark.parametrize("version", ["ai-7", "ai-6"])
def test_the_ai_sdk_answers_two_forms_and_the_server_books_once(
    clients: Path, server: ApiServer, mcp_server: MCPServerProcess, version: str, request: pytest.FixtureRequest
) -> None:
    if version == "ai-6":
        asked, asked_again, done = flow_on_ai_6(request.getfixturevalue("ai_6_scripts"), server, "aisdk-form")
    else:
        asked, asked_again, done = flow(clients, server, "aisdk-form")
    # The server's first question shows as a form on the waiting call
    assert asked["form"]["schema"] == DESTINATION_FORM and asked["form"]["message"] == "Where to?"
    assert asked["callId"] == "call-1" and asked["callState"] == "input-available"
    assert asked["status"] == "WAITING_FOR_USER"
    # Its answer reached the server, which asked the second question
    assert asked_again["form"]["schema"] == DATES_FORM
    assert asked_again["form"]["message"] == "How many nights in Oslo?"
    # The second answer completes the turn, and the server booked once
    assert done["status"] == "ready" and done["error"] is None, done
    assert done["text"] == "done: booked 3 nights in Oslo for ann"
    assert done["metadata"]["status"] == "COMPLETED"
    assert mcp_server.bookings()[f"{_turn_of(done)}:call-1"] == 1


def test_the_ai_sdk_shows_a_url_question_and_goes_on_when_the_person_is_done(clients: Path, server: ApiServer) -> None:
    asked, done = flow(clients, server, "aisdk-url")
    assert asked["form"]["schema"]["required"] == ["done"]
    assert "https://example.test/signin?s=1" in asked["form"]["message"]
    assert done["text"] == "done: account linked" and done["metadata"]["status"] == "COMPLETED"


@pytest.mark.parametrize("version", ["ai-7", "ai-6"])
def test_the_ai_sdk_declines_a_question_and_the_model_reads_the_servers_answer(
    clients: Path, server: ApiServer, mcp_server: MCPServerProcess, version: str, request: pytest.FixtureRequest
) -> None:
    if version == "ai-6":
        asked, done = flow_on_ai_6(request.getfixturevalue("ai_6_scripts"), server, "aisdk-decline")
    else:
        asked, done = flow(clients, server, "aisdk-decline")
    assert asked["form"]["schema"] == DESTINATION_FORM
    assert done["status"] == "ready" and done["error"] is None, done
    assert done["text"] == "failed: booking declined by the user"
    assert done["metadata"]["status"] == "COMPLETED"
    assert "destination:decline" in mcp_server.refused_questions()
    assert f"{_turn_of(done)}:call-1" not in mcp_server.bookings()


def test_ag_ui_answers_two_form_interrupts_and_the_server_books_once(
    clients: Path, server: ApiServer, mcp_server: MCPServerProcess
) -> None:
    asked, asked_again, done = flow(clients, server, "agui")
    for run in (asked, asked_again, done):
        valid(run)
    (interrupt,) = asked["outcome"]["interrupts"]
    assert interrupt["reason"] == "form" and interrupt["responseSchema"] == DESTINATION_FORM
    (again,) = asked_again["outcome"]["interrupts"]
    assert again["id"] == interrupt["id"] == "call-1" and again["responseSchema"] == DATES_FORM
    assert done["outcome"] == {"type": "success"}, done
    assert done["result"] == "done: booked 2 nights in Lima for cy"
    with server.client(KEY_A) as client:
        (turn,) = client.get("/v1/turns", params={"conversation_id": done["threadId"]}).json()["items"]
    assert turn["status"] == "COMPLETED"
    assert mcp_server.bookings()[f"{turn['id']}:call-1"] == 1
