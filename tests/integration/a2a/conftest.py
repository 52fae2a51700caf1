"""Fixtures of the A2A tests: an embedded `agent-runner serve` with two tenants, and the `a2a-sdk` client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.api_server import TENANT_A_KEY, TENANT_B_KEY, ApiServer, two_tenants_server
from tests.integration.langgraph.langgraph_agents import AGENTS

pytestmark = pytest.mark.integration

KEY_A = TENANT_A_KEY
KEY_B = TENANT_B_KEY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An embedded server (SQLite, worker threads in the server) with the tenants `tenant-a` and `tenant-b`."""
    yield from two_tenants_server(AGENTS, tmp_path_factory.mktemp("a2a"))
