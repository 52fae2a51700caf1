"""Fixtures of the HTTP API tests: `agent-runner serve` processes on SQLite files (embedded worker).

Servers are per module (starting one takes a couple of seconds); tests keep out of each
other's way with conversation ids of their own. Every process is stopped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import serve

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api")


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    """An embedded server on a SQLite file of this module."""
    yield from serve(server_dir)
