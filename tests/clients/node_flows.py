"""Running the client scripts of `tests/clients/aisdk` against a test server and reading what they printed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.clients.conftest import KEY_A
from tests.helpers.api_server import ApiServer
from tests.helpers.node import json_lines, run_node


def run_flow(
    clients: Path, server: ApiServer, script: str, name: str, *keys: str, env: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run flow `name` of `script` (with tenant a's key unless `keys` are given); the JSON objects it printed."""
    done = run_node(clients, script, [name, server.url, *(keys or (KEY_A,))], env=env)
    assert done.returncode == 0, done.stderr[-3000:] + server.output()
    found = json_lines(done.stdout)
    assert found, done.stdout
    return found
