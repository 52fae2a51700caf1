"""`agent-runner serve` in a subprocess on a free loopback port, for the tests that need a real server.

The HTTP API tests and the console's browser tests both start it; each passes the agents
to serve as a `module:attribute` of the tests package (loaded by its dotted path, so the
process gets `with_tests_importable`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.helpers.processes import REPO_ROOT, with_tests_importable

AGENT_RUNNER = str(Path(sys.executable).with_name("agent-runner"))
"""The `agent-runner` command of the virtual environment running the tests."""
START_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(database_url: str, **overrides: str) -> dict[str, str]:
    """The test process's environment without any AGENT_RUNNER_/CELERY_ setting, on `database_url`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env["AGENT_RUNNER_DATABASE_URL"] = database_url
    env.update(overrides)
    return with_tests_importable(env)


@dataclass
class ApiServer:
    """A running (once started) `agent-runner serve --agents <agents>` process."""

    agents: str
    """`module:attribute` of the agents to serve, e.g. `tests.integration.api.api_agents:build_loader`."""
    env: dict[str, str]
    log: Path
    args: list[str] = field(default_factory=list)
    port: int = 0
    command: list[str] | None = None
    """Another command serving the API (run with `--port <port>` appended), e.g. uvicorn with a host application."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        """Start the process on a free port and wait until it answers /healthz (fails the test if it never does)."""
        self.port = free_port()
        if self.command is None:
            command = [AGENT_RUNNER, "serve", "--agents", self.agents, "--port", str(self.port), *self.args]
        else:
            command = [*self.command, "--port", str(self.port)]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                command, cwd=REPO_ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"the server exited with {self.process.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer within {START_TIMEOUT_S}s:\n{self.output()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the process group (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_TIMEOUT_S)
        self.process = None

    def restart(self) -> ApiServer:
        self.stop()
        return self.start()

    def output(self) -> str:
        """The end of the server's log."""
        return self.log.read_text(errors="replace")[-8000:] if self.log.exists() else ""

    def client(self, key: str | None = None) -> httpx.Client:
        """An HTTP client of the server, with `key` as the bearer token when given."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def running_server(
    agents: str, workdir: Path, database_url: str | None = None, args: list[str] | None = None, **env: str
) -> Iterator[ApiServer]:
    """Start a server (on a SQLite file in `workdir` unless `database_url` is given); stop it when resumed.

    A generator for fixtures (`yield from running_server(...)`) and `contextlib.contextmanager`.
    """
    url = database_url or f"sqlite:///{workdir / 'api.db'}"
    server = ApiServer(
        agents=agents, env=server_env(url, **env), log=workdir / f"server-{free_port()}.log", args=list(args or [])
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


TENANT_A_KEY = "key-a-0123456789"
TENANT_B_KEY = "key-b-9876543210"
TWO_TENANTS = {
    "AGENT_RUNNER_API_KEYS": f"tenant-a:{TENANT_A_KEY},tenant-b:{TENANT_B_KEY}",
    "AGENT_RUNNER_TOKEN_SECRET": "a-test-secret-of-enough-length-0123456789",
}
"""The settings of a server with the tenants `tenant-a` and `tenant-b` (their keys above), and browser tokens on."""


def two_tenants_server(agents: str, workdir: Path) -> Iterator[ApiServer]:
    """A server of `agents` with the tenants of `TWO_TENANTS` (a generator for fixtures, like `running_server`)."""
    yield from running_server(agents, workdir, None, None, **TWO_TENANTS)
