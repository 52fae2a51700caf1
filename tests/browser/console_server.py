"""A real `agent-runner serve` subprocess in embedded mode (SQLite, worker threads) for the console tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass
class ConsoleServer:
    """The running server: its base URL, database and log, and a small JSON client."""

    url: str
    database_url: str
    log: Path
    keys: dict[str, str] = field(default_factory=dict)
    """Tenant -> API key, when the server was started with keys."""

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, key: str | None = None
    ) -> tuple[int, Any]:
        """Send one JSON request; returns (status, parsed body). Never raises for an HTTP error status."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            text = error.read().decode()
            return error.code, json.loads(text) if text else None

    def ok(self, method: str, path: str, body: dict[str, Any] | None = None, *, key: str | None = None) -> Any:
        """Like `call`, but fails the test unless the answer is 2xx."""
        status, answer = self.call(method, path, body, key=key)
        assert 200 <= status < 300, f"{method} {path} -> {status}: {answer}"
        return answer

    def turn(self, turn_id: str, *, key: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.ok("GET", f"/v1/turns/{turn_id}?messages=true", key=key)
        return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve(workdir: Path, *, api_keys: str | None = None, name: str = "server") -> Iterator[ConsoleServer]:
    """Run `agent-runner serve --agents console_agents:AGENTS` on a free loopback port until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{workdir / (name + '.db')}"
    port = _free_port()
    env = {
        **os.environ,
        "AGENT_RUNNER_DATABASE_URL": database_url,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("AGENT_RUNNER_API_KEYS", None)
    if api_keys:
        env["AGENT_RUNNER_API_KEYS"] = api_keys
    log = workdir / f"{name}.log"
    command = [
        str(Path(sys.executable).with_name("agent-runner")),
        "serve",
        "--agents",
        "console_agents:AGENTS",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker",
        "embedded",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
        server = ConsoleServer(
            url=f"http://127.0.0.1:{port}",
            database_url=database_url,
            log=log,
            keys=dict(tuple(pair.split(":", 1)) for pair in api_keys.split(",")) if api_keys else {},
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"agent-runner serve exited with {process.returncode}:\n{log.read_text()}")
                try:
                    with urllib.request.urlopen(server.url + "/readyz", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"agent-runner serve did not become ready:\n{log.read_text()}")
                time.sleep(0.2)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
