"""MCP servers as toolsets: listing, calls, approvals, the outcome ledger and errors, against a real server process."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    InMemoryAgentTurnStore,
    ScriptedChatModel,
    SuspensionType,
)
from agent_runner.mcp import MCPToolset
from agent_runner.mcp._toolset import MCPTool
from tests.helpers.mcp_server import MCPServerProcess
from tests.integration.mcp.mcp_kit import Model, agent_with, runner_for, tool_results

S = AgentTurnStatus


def test_the_model_sees_the_servers_schemas_filtered_and_prefixed(module_mcp_server: MCPServerProcess) -> None:
    model = Model(("crm_add", {"a": 2, "b": 3}))
    toolset = MCPToolset(
        module_mcp_server.url, prefix="crm_", include=["add", "delete_record", "huge"], exclude=["huge"]
    )
    agent = agent_with(model, toolset)

    turn = runner_for(agent).run(agent, "add 2 and 3")

    assert turn.status is S.COMPLETED, turn.error
    specs = {spec.name: spec for spec in model.requests[0].tools}
    assert set(specs) == {"crm_add", "crm_delete_record"}
    assert specs["crm_add"].parameters["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert specs["crm_add"].description == "Add two integers."
    # The schemas travel once per turn: every model call of the turn is shown the same list.
    assert [spec.name for spec in model.requests[1].tools] == [spec.name for spec in model.requests[0].tools]
    assert [m.content for m in tool_results(turn)] == ["5"]
    assert {t.name for t in turn.listed_tools or []} == {"crm_add", "crm_delete_record"}
    assert next(t for t in turn.listed_tools or [] if t.name == "crm_add").annotations == {"readOnlyHint": True}


def test_arguments_that_fail_the_servers_schema_are_answered_for_the_model(module_mcp_server: MCPServerProcess) -> None:
    model = Model(("add", {"a": "two", "b": 3}))
    agent = agent_with(model, MCPToolset(module_mcp_server.url))

    turn = runner_for(agent).run(agent, "add")

    [message] = tool_results(turn)
    assert message.is_error and "a: 'two' is not of type 'integer'" in message.content


def test_a_turn_calls_the_tools_it_was_shown_and_a_vanished_tool_answers_an_error(
    mcp_server: MCPServerProcess,
) -> None:
    model = Model(("add", {"a": 1, "b": 1}), ("whoami", {}))
    store = InMemoryAgentTurnStore()
    agent = agent_with(model, MCPToolset(mcp_server.url, requires_approval=["add", "whoami"]))
    runner = runner_for(agent, store=store)

    waiting = runner.run(agent, "go")
    assert waiting.status is S.WAITING_FOR_APPROVAL
    # The server is redeployed without `whoami`; a new process (new toolset, empty cache) resumes the turn.
    mcp_server.restart(hide=["whoami"])
    model_after = Model()
    model_after.calls = model.calls
    redeployed = agent_with(model_after, MCPToolset(mcp_server.url, requires_approval=["add", "whoami"]))
    runner = runner_for(redeployed, store=store)

    turn = runner.resume(waiting.id, AgentResumeCommand.approve_tool("call-1"))
    assert turn.status is S.WAITING_FOR_APPROVAL
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("call-2"))

    assert turn.status is S.COMPLETED, turn.error
    first, second = tool_results(turn)
    assert (first.content, first.is_error) == ("2", False)
    assert second.is_error and "Unknown tool: whoami" in second.content
    # The model went on with the list the turn was shown, not the server's new one.
    assert "whoami" in [spec.name for spec in model_after.requests[-1].tools]


def test_headers_come_from_the_turns_tenant(module_mcp_server: MCPServerProcess) -> None:
    def credentials(context: AgentToolContext) -> dict[str, str]:
        return {"Authorization": f"Bearer key-of-{context.tenant_id}", "X-Tenant": str(context.tenant_id)}

    agent = agent_with(
        Model(("whoami", {})), MCPToolset(module_mcp_server.url, headers=credentials, include=["whoami"])
    )
    runner = runner_for(agent)

    seen = {}
    for tenant in ("acme", "globex"):
        model = Model(("whoami", {}))
        agent.chat_model = ScriptedChatModel(model)
        turn = runner.run(agent, "who am i", tenant_id=tenant)
        seen[tenant] = json.loads(tool_results(turn)[0].content)

    assert seen == {
        "acme": {"authorization": "Bearer key-of-acme", "tenant": "acme"},
        "globex": {"authorization": "Bearer key-of-globex", "tenant": "globex"},
    }


class RecordingStore(InMemoryAgentTurnStore):
    """Remembers the started calls of every snapshot it saved."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[list[str]] = []

    def save(self, turn: AgentTurn, expected_version: int, *args: Any, **kwargs: Any) -> AgentTurn:
        self.started.append(list(turn.started_call_ids))
        return super().save(turn, expected_version, *args, **kwargs)


def test_a_destructive_tool_saves_its_start_first_and_sends_the_idempotency_key(
    module_mcp_server: MCPServerProcess,
) -> None:
    store = RecordingStore()
    model = Model(("delete_record", {"record_id": "r-7"}))
    toolset = MCPToolset(module_mcp_server.url)
    agent = agent_with(model, toolset)

    turn = runner_for(agent, store=store).run(agent, "delete r-7")

    assert turn.status is S.COMPLETED, turn.error
    assert tool_results(turn)[0].content == "deleted r-7"
    assert ["call-1"] in store.started, "the start of a non-idempotent call is saved before it runs"
    assert module_mcp_server.executions() == {f"{turn.id}:call-1": 1}
    listed = next(t for t in turn.listed_tools or [] if t.name == "delete_record")
    assert toolset.tool(listed).idempotent is False
    add = next(t for t in turn.listed_tools or [] if t.name == "add")
    assert toolset.tool(add).idempotent is True


def test_a_call_cut_short_by_a_timeout_is_put_to_a_person_not_run_again(module_mcp_server: MCPServerProcess) -> None:
    model = Model(("delete_record", {"record_id": "r-8", "hold": 2.0}))
    agent = agent_with(model, MCPToolset(module_mcp_server.url, timeout=0.5))
    runner = runner_for(agent)

    turn = runner.run(agent, "delete r-8")

    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.type is SuspensionType.TOOL_OUTCOME_UNKNOWN
    assert "the call may have acted" in (turn.suspension.message or "")


def test_errors_are_sorted(module_mcp_server: MCPServerProcess) -> None:
    events: list[AgentEvent] = []
    model = Model(("flaky", {"key": "k1"}), ("broken", {}), ("huge", {"size": 2048}))
    agent = agent_with(model, MCPToolset(module_mcp_server.url, max_result_bytes=1024))
    runner = runner_for(agent)
    runner.add_event_listener(events.append)

    turn = runner.run(agent, "go")
    # 503 with Retry-After: 1 -> the retry schedule, honouring the server's wait.
    assert turn.status is S.RETRY_SCHEDULED
    assert turn.next_retry_at is not None and (turn.next_retry_at - turn.updated_at).total_seconds() >= 0.99
    time.sleep(1.0)
    turn = runner.run_until_blocked(runner.restore(turn.id))

    assert turn.status is S.COMPLETED, turn.error
    flaky, broken, huge = tool_results(turn)
    assert (flaky.content, flaky.is_error) == ("ok k1", False)
    assert (broken.content, broken.is_error) == ("the backend said no", True)
    assert huge.is_error and "over the limit of 1024 bytes" in huge.content
    assert [e.type for e in events].count(AgentEventType.RETRY_SCHEDULED) == 1


def test_an_unreachable_server_puts_the_turn_on_the_retry_schedule(mcp_server: MCPServerProcess) -> None:
    mcp_server.stop()
    agent = agent_with(Model(("add", {"a": 1, "b": 2})), MCPToolset(mcp_server.url, timeout=2))

    turn = runner_for(agent).run(agent, "go")

    assert turn.status is S.RETRY_SCHEDULED
    assert "could not be reached" in (
        turn.suspension.message if turn.suspension else ""
    ) or "could not be reached" in str(turn.model_dump())


def test_progress_notifications_become_tool_progress_events(module_mcp_server: MCPServerProcess) -> None:
    events: list[AgentEvent] = []
    agent = agent_with(Model(("progress", {})), MCPToolset(module_mcp_server.url))
    runner = runner_for(agent)
    runner.add_event_listener(events.append)

    turn = runner.run(agent, "go")

    assert turn.status is S.COMPLETED
    progress = [e.data["progress"] for e in events if e.type is AgentEventType.TOOL_PROGRESS]
    assert progress == [
        {"progress": 1.0, "total": 2.0, "message": "half way"},
        {"progress": 2.0, "total": 2.0, "message": "done"},
    ]


def test_a_tool_whose_schema_is_not_json_schema_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    from mcp_types import Tool as Description

    toolset = MCPToolset("http://127.0.0.1:9/mcp")
    good = Description(name="fine", input_schema={"type": "object", "properties": {"x": {"type": "string"}}})
    bad = Description(name="odd", input_schema={"type": "object", "properties": {"x": {"type": 12}}})

    assert toolset._listed(bad) is None
    listed = toolset._listed(good)
    assert listed is not None and isinstance(toolset.tool(listed), MCPTool)
    assert "tool 'odd' is left out: its input schema is not valid JSON Schema" in caplog.text
