"""A real MCP server process (the `mcp` SDK's server API) for the MCP toolset tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.mcp_server import MCPServerProcess, running_mcp_server


@pytest.fixture
def mcp_server(tmp_path: Path) -> Iterator[MCPServerProcess]:
    yield from running_mcp_server(tmp_path)


@pytest.fixture(scope="module")
def module_mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MCPServerProcess]:
    """One server for a whole test module, for tests that never stop or restart it."""
    yield from running_mcp_server(tmp_path_factory.mktemp("mcp"))
