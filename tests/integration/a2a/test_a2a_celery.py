"""The `a2a-sdk` client against `agent-runner serve --worker celery`: PostgreSQL, Redis and a Celery worker process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from a2a.types import TaskState

from tests.helpers.api_server import ApiServer
from tests.integration.a2a.a2a_client import collect, connect, data_of, message, send
from tests.integration.a2a.conftest import KEY_A
from tests.integration.api.api_server import api_on_celery
from tests.integration.langgraph.langgraph_agents import AGENTS, story

pytestmark = pytest.mark.integration


@pytest.fixture
def server(pg_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    with api_on_celery(
        pg_url, tmp_path, AGENTS, server_args=["--worker", "celery"], AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A}"
    ) as stack:
        yield stack.server


def test_tasks_run_on_celery_workers(server: ApiServer) -> None:
    async def scenario() -> None:
        async with connect(server, "desk", KEY_A, streaming=False) as client:
            task = await send(client, message("ticket please"))
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert data_of(task.status.message.parts[-1])["form"]["key"] == "ticket_details"
            task = await send(client, message(data={"system": "vpn", "scope": "ONE_USER"}, task_id=task.id))
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            task = await send(client, message(data={"approved": True}, task_id=task.id))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert task.artifacts[0].parts[0].text == "opened TICKET-vpn-ONE_USER"
        # Text a worker process streams reaches the client through Redis, in order.
        async with connect(server, "writer", KEY_A, streaming=True) as streaming:
            events = await collect(streaming.send_message(message("story 12")))
        parts = [p.text for e in events if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts]
        assert "".join(parts) == story(12)
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    asyncio.run(scenario())
