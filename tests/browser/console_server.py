"""A real `agent-runner serve` of the console's agents (embedded mode: SQLite and worker threads), with a JSON client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.browser import console_agents
from tests.helpers.api_server import ApiServer, running_server

AGENTS = f"{console_agents.__name__}:AGENTS"


@dataclass
class ConsoleServer:
    """The running server, its database, and a small JSON client of its API."""

    api: ApiServer
    database_url: str
    keys: dict[str, str] = field(default_factory=dict)
    """Tenant -> API key, when the server was started with keys."""

    @property
    def url(self) -> str:
        return self.api.url

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, key: str | None = None
    ) -> tuple[int, Any]:
        """Send one JSON request; returns (status, parsed body). Never raises for an HTTP error status."""
        with self.api.client(key) as client:
            response = client.request(method, path, json=body)
        return response.status_code, response.json() if response.content else None

    def ok(self, method: str, path: str, body: dict[str, Any] | None = None, *, key: str | None = None) -> Any:
        """Like `call`, but fails the test unless the answer is 2xx."""
        status, answer = self.call(method, path, body, key=key)
        assert 200 <= status < 300, f"{method} {path} -> {status}: {answer}"
        return answer

    def turn(self, turn_id: str, *, key: str | None = None) -> dict[str, Any]:
        """The turn's view with its messages."""
        result: dict[str, Any] = self.ok("GET", f"/v1/turns/{turn_id}?messages=true", key=key)
        return result


def _parse_keys(api_keys: str) -> dict[str, str]:
    pairs = (pair.strip().split(":", 1) for pair in api_keys.split(","))
    return {tenant: key for tenant, key in pairs}


@contextmanager
def serve(workdir: Path, *, api_keys: str | None = None, **env: str) -> Iterator[ConsoleServer]:
    """Run `agent-runner serve` of `console_agents.AGENTS` on a free loopback port until the block ends.

    Args:
        workdir: Holds the SQLite database and the server's log.
        api_keys: `tenant:key,...` to require API keys (none: the loopback server is open).
        env: More environment of the server process.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{workdir / 'console.db'}"
    if api_keys:
        env["AGENT_RUNNER_API_KEYS"] = api_keys
    with contextmanager(running_server)(AGENTS, workdir, database_url, ["--worker", "embedded"], **env) as api:
        yield ConsoleServer(api=api, database_url=database_url, keys=_parse_keys(api_keys) if api_keys else {})
