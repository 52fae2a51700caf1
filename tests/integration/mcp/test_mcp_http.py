"""MCP tools behind the HTTP API: an elicitation answered through /v1 and the LangGraph SDK, across a restart."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from tests.helpers.api_server import ApiServer, running_server
from tests.helpers.mcp_agents import LOADER, ask
from tests.helpers.mcp_server import DATES_FORM, DESTINATION_FORM, MCPServerProcess

pytestmark = pytest.mark.integration

KEY_A = "key-of-tenant-a"
KEY_B = "key-of-tenant-b"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_mcp_server: MCPServerProcess) -> Iterator[ApiServer]:
    yield from running_server(
        LOADER,
        tmp_path_factory.mktemp("api"),
        AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A},tenant-b:{KEY_B}",
        MCP_TEST_URL=module_mcp_server.url,
    )


def settled(client: httpx.Client, turn_id: str, version: int = -1, timeout: float = 20.0) -> dict[str, Any]:
    """The turn once the worker has taken it past `version` and it waits or has ended."""
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = client.get(f"/v1/turns/{turn_id}").json()
        if view["version"] > version and view["status"] not in ("READY", "RUNNING", "RETRY_SCHEDULED"):
            return view
        assert time.monotonic() < deadline, f"turn {turn_id} still {view['status']}"
        time.sleep(0.05)


def test_a_two_round_form_is_answered_through_the_http_api_across_a_restart(server: ApiServer) -> None:
    with server.client(KEY_A) as client:
        created = client.post(
            "/v1/turns", json={"agent_id": "mcp-agent", "input": ask("book_trip", traveller="ann")}
        ).json()
        waiting = settled(client, created["id"])
        assert waiting["status"] == "WAITING_FOR_USER"
        suspension = waiting["suspension"]
        assert suspension["form"]["schema"] == DESTINATION_FORM and suspension["message"] == "Where to?"
        assert suspension["tool_call"]["name"] == "book_trip"
        resume = f"/v1/turns/{created['id']}/resume"
        refused = client.post(resume, json={"action": "form", "tool_call_id": "call-1", "data": {}})
        assert refused.status_code == 422, refused.text

    server.restart()  # the question was asked by one process, the answer is taken by the next

    with server.client(KEY_A) as client:
        answered = client.post(resume, json={"action": "form", "tool_call_id": "call-1", "data": {"city": "Oslo"}})
        assert answered.status_code == 202, answered.text
        second = settled(client, created["id"], answered.json()["version"])
        assert second["suspension"]["form"]["schema"] == DATES_FORM
        answered = client.post(resume, json={"action": "form", "tool_call_id": "call-1", "data": {"nights": 4}})
        done = settled(client, created["id"], answered.json()["version"])

    assert done["status"] == "COMPLETED", done
    assert done["final_output"] == "done: booked 4 nights in Oslo for ann"


def test_the_langgraph_sdk_answers_each_round_as_an_interrupt(server: ApiServer) -> None:
    with get_sync_client(url=server.url, api_key=KEY_B) as client:
        answer_three_rounds(client)


def answer_three_rounds(client: SyncLangGraphClient) -> None:
    thread_id = client.threads.create()["thread_id"]
    start: dict[str, Any] = {"messages": [{"role": "user", "content": ask("book_trip", traveller="bo")}]}
    first: Any = client.runs.wait(thread_id, "mcp-agent", input=start)
    (interrupt,) = first["__interrupt__"]
    assert interrupt["value"]["type"] == "form" and interrupt["value"]["response_schema"] == DESTINATION_FORM

    second: Any = client.runs.wait(thread_id, "mcp-agent", command={"resume": {"city": "Lima"}})
    (interrupt,) = second["__interrupt__"]
    assert interrupt["value"]["response_schema"] == DATES_FORM

    final: Any = client.runs.wait(thread_id, "mcp-agent", command={"resume": {"nights": 2}})
    assert final["messages"][-1]["content"] == "done: booked 2 nights in Lima for bo"


def test_each_tenants_calls_carry_its_own_credentials(server: ApiServer) -> None:
    seen = {}
    for tenant, key in (("tenant-a", KEY_A), ("tenant-b", KEY_B)):
        with server.client(key) as client:
            created = client.post("/v1/turns", json={"agent_id": "mcp-agent", "input": ask("whoami")}).json()
            output = settled(client, created["id"])["final_output"]
        seen[tenant] = json.loads(output.removeprefix("done: "))
    assert seen == {
        "tenant-a": {"authorization": "Bearer key-of-tenant-a", "tenant": "tenant-a"},
        "tenant-b": {"authorization": "Bearer key-of-tenant-b", "tenant": "tenant-b"},
    }


def test_a_question_declined_through_the_http_api_reaches_the_server_and_the_model(
    server: ApiServer, module_mcp_server: MCPServerProcess
) -> None:
    with server.client(KEY_A) as client:
        created = client.post(
            "/v1/turns", json={"agent_id": "mcp-agent", "input": ask("book_trip", traveller="cy")}
        ).json()
        settled(client, created["id"])
        resume = f"/v1/turns/{created['id']}/resume"
        declined = client.post(resume, json={"action": "reject", "tool_call_id": "call-1", "reason": "no trips"})
        assert declined.status_code == 202, declined.text
        done = settled(client, created["id"], declined.json()["version"])

    assert done["status"] == "COMPLETED", done
    assert done["final_output"] == "failed: booking declined by the user"
    assert "destination:decline" in module_mcp_server.refused_questions()
