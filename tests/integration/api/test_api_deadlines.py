"""Approval deadlines in `agent-runner serve`'s embedded mode, where no beat runs: its worker sweeps them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner import AgentEvent
from tests.helpers import deadline_agents
from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.deadline_agents import APPROVAL_TIMEOUT_S, SWEEP_ENV, deadline_problems
from tests.integration.api.api_server import ended, read_stream, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ApiServer]:
    """An embedded server of the deadline agents that sweeps five times a second and reminds halfway."""
    yield from running_server(
        f"{deadline_agents.__name__}:build_loader", tmp_path, database_url=None, args=None, **SWEEP_ENV
    )


def test_the_embedded_server_reminds_then_approves_by_default_at_the_deadline(server: ApiServer) -> None:
    with server.client() as client:
        # Given a turn waiting for an approval that is approved by default
        created = client.post(
            "/v1/turns", json={"agent_id": "ops", "input": "restart api", "conversation_id": "c-deadline"}
        )
        assert created.status_code == 201, created.text
        turn_id = created.json()["id"]
        waiting = wait_for(client, turn_id, lambda view: view["status"] == "WAITING_FOR_APPROVAL")
        assert waiting["suspension"]["on_timeout"] == "approve" and waiting["suspension"]["deadline"]

        # When nobody decides
        done = wait_for(client, turn_id, ended, timeout=APPROVAL_TIMEOUT_S + 30, what="the deadline's default")

        # Then the turn went on with the call approved, and the card says the deadline decided
        assert (done["status"], done["final_output"]) == ("COMPLETED", "done: restarted api")
        (card,) = [m for m in client.get("/v1/conversations/c-deadline/messages").json()["items"] if m.get("action_id")]
        assert (card["status"], card["decided_by"], card["reason"]) == ("APPROVED", "system", "deadline passed")
        # And the event stream holds the reminder before the deadline and the resume at it
        _, stream = read_stream(client, f"/v1/turns/{turn_id}/events", until_end=False, params={"follow": "false"})
    events = [AgentEvent.model_validate(item["data"]) for item in stream if item.get("event") != "end"]
    assert deadline_problems(events, "call-restart") == []
