"""Fixtures of the LangGraph API tests: an embedded `agent-runner serve` of `langgraph_agents` per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.api_server import ApiServer, running_server
from tests.integration.langgraph.langgraph_agents import AGENTS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("langgraph")


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    """An embedded server (SQLite, worker threads in the server) of this module."""
    yield from running_server(AGENTS, server_dir)
