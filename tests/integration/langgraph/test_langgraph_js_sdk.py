"""The unmodified `@langchain/langgraph-sdk` JavaScript `Client`, in Node, against a real `agent-runner serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.api_server import ApiServer
from tests.helpers.node import json_lines, run_node
from tests.integration.langgraph.langgraph_agents import story

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2] / "clients" / "langgraph"


def test_the_js_client_runs_the_core_flow(server: ApiServer) -> None:
    # When the JS client streams a run, answers a form and an approval, and joins a stream
    done = run_node(PROJECT, "core_flow.mjs", [server.url])
    assert done.returncode == 0, done.stderr[-3000:]
    steps: dict[Any, Any] = {line["step"]: line for line in json_lines(done.stdout)}
    # Then every step saw what the Python client sees
    assert {"desk", "writer"} <= set(steps["assistants"]["ids"])
    assert steps["thread"]["status"] == "idle"
    stream = steps["stream"]
    assert stream["tokens"] == story(8)
    events = stream["events"]
    assert isinstance(events, list) and events[0] == "metadata" and events[-1] == "end"
    assert {"values", "updates", "messages"} <= set(events)
    (form,) = steps["form_interrupt"]["interrupts"]
    assert form["value"]["response_schema"]["required"] == ["system", "scope"]
    assert steps["state"]["next"] == ["tools"] and steps["state"]["interrupts"] == [form]
    (approval,) = steps["approval_interrupt"]["interrupts"]
    assert approval["value"]["action_requests"][0]["name"] == "open_ticket"
    assert steps["done"]["last"] == "opened TICKET-web-ONE_USER"
    assert steps["finished"] == {"step": "finished", "status": "idle", "runs": ["success"]}
    assert steps["joined"]["tokens"] == story(8)
