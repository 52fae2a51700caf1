"""The LangGraph API in front of real Celery workers, on PostgreSQL and Redis (`agent-runner serve --worker celery`)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.schema import StreamPart

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import api_on_celery
from tests.integration.langgraph.langgraph_agents import AGENTS, story

pytestmark = pytest.mark.integration


@pytest.fixture
def server(pg_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    """PostgreSQL, Redis, one Celery worker process and the API server, all of this test alone."""
    with api_on_celery(pg_url, tmp_path, AGENTS, server_args=["--worker", "celery"]) as stack:
        yield stack.server


def test_the_core_flow_runs_on_celery_workers(server: ApiServer) -> None:
    with get_sync_client(url=server.url, api_key=None) as client:
        any_client: Any = client
        # Tokens streamed by a worker process reach the client through Redis
        thread_id = client.threads.create()["thread_id"]
        modes: Any = ["values", "messages-tuple"]
        received: list[StreamPart] = []
        stream = any_client.runs.stream(
            thread_id, "writer", input={"messages": [{"role": "user", "content": "story 20"}]}, stream_mode=modes
        )
        assert isinstance(stream, Generator)
        run_id = ""
        for part in stream:
            received.append(part)
            run_id = part.data["run_id"] if part.event == "metadata" else run_id
            if part.event == "messages" and sum(p.event == "messages" for p in received) == 4:
                break
        stream.close()
        # A reconnect from the last event id misses and repeats nothing
        rest = list(client.runs.join_stream(thread_id, run_id, stream_mode=modes, last_event_id=received[-1].id))
        tokens = "".join(p.data[0]["content"] for p in received + rest if p.event == "messages")
        assert tokens == story(20)
        assert rest[-1].event == "end"
        # Interrupts and resumes go through the workers
        ticket = client.threads.create()["thread_id"]
        first: Any = any_client.runs.wait(ticket, "desk", input={"messages": [{"role": "user", "content": "ticket"}]})
        assert first["__interrupt__"][0]["value"]["form_key"] == "ticket_details"
        second: Any = any_client.runs.wait(ticket, "desk", command={"resume": {"system": "vpn", "scope": "ONE_USER"}})
        assert second["__interrupt__"][0]["value"]["action_requests"][0]["name"] == "open_ticket"
        done: Any = any_client.runs.wait(ticket, "desk", command={"resume": {"decisions": [{"type": "approve"}]}})
        assert done["messages"][-1]["content"] == "opened TICKET-vpn-ONE_USER"
        assert client.threads.get(ticket)["status"] == "idle"
