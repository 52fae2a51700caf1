"""A server stopped while event streams are open ends them at once and quietly."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers.api_server import ApiServer, running_server
from tests.integration.api.api_server import AGENTS, blocked, wait_for

pytestmark = pytest.mark.integration

STREAMS = 4
STOP_WITHIN_S = 3.0
"""Far below uvicorn's graceful timeout (5 s), which open streams used to run out."""


def _follow(server: ApiServer, path: str, opened: threading.Semaphore, closed: list[str]) -> None:
    """Read a stream until the server ends it; say how it ended."""
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client, client.stream("GET", path) as response:
            opened.release()
            for _ in response.iter_lines():
                pass
        closed.append("ended")
    except httpx.HTTPError as exc:
        closed.append(type(exc).__name__)


def test_sigterm_ends_open_event_streams_promptly_without_tracebacks(tmp_path: Path) -> None:
    with contextmanager(running_server)(AGENTS, tmp_path) as server:
        # Given a waiting turn, and streams open on it and on its conversation
        chat = f"c-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            created = client.post("/v1/turns", json={"agent_id": "desk", "input": "ticket", "conversation_id": chat})
            turn = wait_for(client, created.json()["id"], blocked)
        opened = threading.Semaphore(0)
        closed: list[str] = []
        paths = [f"/v1/turns/{turn['id']}/events", f"/v1/conversations/{chat}/events"] * (STREAMS // 2)
        readers = [threading.Thread(target=_follow, args=(server, path, opened, closed)) for path in paths]
        for reader in readers:
            reader.start()
        for _ in readers:
            assert opened.acquire(timeout=30)
        time.sleep(0.5)  # the streams are waiting for events
        # When the server gets SIGTERM
        process = server.process
        assert process is not None
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        took = time.monotonic() - started
        for reader in readers:
            reader.join(10)
    # Then it exits soon, every stream ended, and the log shows no traceback
    log = server.output()
    assert code in (0, -signal.SIGTERM), log  # uvicorn re-raises the signal it handled
    assert took < STOP_WITHIN_S, f"stopping took {took:.1f}s:\n{log}"
    assert len(closed) == STREAMS
    assert "Traceback" not in log and "ERROR" not in log, log
