"""Fixtures of the client-protocol tests: a server of `chat_agents` with two tenants, and its npm project."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.node import npm_project

pytestmark = pytest.mark.integration

AGENTS = "tests.clients.chat_agents:build_loader"
KEY_A = "key-of-tenant-a"
KEY_B = "key-of-tenant-b"
API_KEYS = f"tenant-a:{KEY_A},tenant-b:{KEY_B}"
TOKEN_SECRET = "a-secret-of-the-client-protocol-tests-0123456789"
"""Signs the short-lived browser tokens of the test server (`POST /v1/tokens`)."""
CLIENTS = Path(__file__).resolve().parent / "aisdk"
"""The npm project of the client packages (`ai`, `@ag-ui/client`)."""
AI_SDK_6 = Path(__file__).resolve().parent / "aisdk6"
"""The AI SDK as `npm install ai @ai-sdk/react` resolves it on Node.js 20: `ai` 6 (`ai` 7 needs Node.js 22)."""


@pytest.fixture(scope="session")
def clients() -> Path:
    """The installed npm project of the client packages."""
    return npm_project(CLIENTS)


@pytest.fixture(scope="session")
def ai_sdk_6() -> Path:
    """The installed npm project of `ai` 6 and `@ai-sdk/react` 3."""
    return npm_project(AI_SDK_6)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An embedded server (SQLite) of `chat_agents`, with the keys of two tenants and browser tokens."""
    yield from running_server(
        AGENTS,
        tmp_path_factory.mktemp("clients"),
        AGENT_RUNNER_API_KEYS=API_KEYS,
        AGENT_RUNNER_TOKEN_SECRET=TOKEN_SECRET,
    )
