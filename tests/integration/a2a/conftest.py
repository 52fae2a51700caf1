"""Fixtures of the A2A tests: an embedded `agent-runner serve` with two tenants, and the `a2a-sdk` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.api_server import ApiServer, running_server
from tests.integration.langgraph.langgraph_agents import AGENTS

pytestmark = pytest.mark.integration

KEY_A = "key-a-0123456789"
KEY_B = "key-b-9876543210"


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("a2a")


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    """An embedded server (SQLite, worker threads in the server) with tenants `tenant-a` and `tenant-b`."""
    yield from running_server(
        AGENTS,
        server_dir,
        AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A},tenant-b:{KEY_B}",
        AGENT_RUNNER_TOKEN_SECRET="a-test-secret-of-enough-length-0123456789",
    )
