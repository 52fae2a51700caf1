"""`agent-runner serve` in a subprocess on a free port, and an HTTP client for it (used by the API tests)."""

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
from typing import Any

import httpx
import pytest

from tests.helpers.processes import REPO_ROOT, with_tests_importable
from tests.integration.api import api_agents

ROOT = REPO_ROOT
AGENTS = f"{api_agents.__name__}:build_loader"
AGENT_RUNNER = str(Path(sys.executable).with_name("agent-runner"))
START_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(database_url: str, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env["AGENT_RUNNER_DATABASE_URL"] = database_url
    env.update(overrides)
    return with_tests_importable(env)


@dataclass
class ApiServer:
    """A running `agent-runner serve` process."""

    env: dict[str, str]
    log: Path
    args: list[str] = field(default_factory=list)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        self.port = free_port()
        command = [AGENT_RUNNER, "serve", "--agents", AGENTS, "--port", str(self.port), *self.args]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
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
        return self.log.read_text(errors="replace")[-8000:] if self.log.exists() else ""

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def wait_for(client: httpx.Client, turn_id: str, until: Any, timeout: float = 20.0, what: str = "") -> dict[str, Any]:
    """Poll GET /v1/turns/{id} until `until(view)`; return the view."""
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = client.get(f"/v1/turns/{turn_id}").json()
        if until(view):
            return view
        if time.monotonic() > deadline:
            pytest.fail(f"turn {turn_id} never reached {what or until}: {view}")
        time.sleep(0.05)


def blocked(view: dict[str, Any]) -> bool:
    return view["status"] not in ("READY", "RUNNING")


def status_is(*statuses: str) -> Any:
    return lambda view: view["status"] in statuses


def assert_error(response: httpx.Response, status: int, type_name: str | None = None) -> dict[str, Any]:
    """The response is an error answer of this status, in the API's error shape."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert isinstance(error["type"], str) and isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], list)
    if type_name is not None:
        assert error["type"] == type_name, error
    return error


def serve(
    tmp_path: Path, database_url: str | None = None, args: list[str] | None = None, **env: str
) -> Iterator[ApiServer]:
    """Start a server for a fixture and stop it afterwards."""
    url = database_url or f"sqlite:///{tmp_path / 'api.db'}"
    server = ApiServer(env=server_env(url, **env), log=tmp_path / f"server-{free_port()}.log", args=list(args or []))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def eventually(produce: Any, timeout: float = 20.0, what: str = "the condition") -> Any:
    """Call `produce()` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = produce()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def database_state(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every agent-runner table, to check that a request changed nothing."""
    import sqlalchemy as sa

    from store.schema import metadata

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return {
                table.name: sorted(
                    (tuple(str(value) for value in row) for row in connection.execute(sa.select(table))), key=str
                )
                for table in metadata.sorted_tables
            }
    finally:
        engine.dispose()


TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "MAX_ITERATIONS_REACHED", "MAX_STEPS_REACHED", "BUDGET_EXCEEDED")


def ended(view: dict[str, Any]) -> bool:
    return view["status"] in TERMINAL


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of a server-sent-events body: `{"id", "event", "data"}` (data parsed as JSON), comments dropped."""
    import json

    events: list[dict[str, Any]] = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if fields:
            if "data" in fields:
                fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events


def read_stream(
    client: httpx.Client, path: str, *, until_end: bool = True, **kwargs: Any
) -> tuple[str, list[dict[str, Any]]]:
    """Read an SSE stream until `event: end` (or until the server closes it); return the raw text and the events."""
    chunks: list[str] = []
    with client.stream("GET", path, timeout=httpx.Timeout(30, read=30), **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for chunk in response.iter_text():
            chunks.append(chunk)
            if until_end and "event: end\n" in "".join(chunks):
                break
    text = "".join(chunks)
    return text, parse_sse(text)
