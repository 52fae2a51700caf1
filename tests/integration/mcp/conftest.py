"""A real MCP server process (the `mcp` SDK's server API) for the MCP toolset tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.mcp_server import MCPServerProcess


@pytest.fixture
def mcp_server(tmp_path: Path) -> Iterator[MCPServerProcess]:
    server = MCPServerProcess(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()
