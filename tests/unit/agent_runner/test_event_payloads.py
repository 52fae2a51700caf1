"""Every event type has one payload model, and the runner's events have its shape."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryChatMemoryProvider,
    RecoverableError,
    ScriptedChatModel,
    ToolCall,
    UserMessage,
    tool,
)
from agent_runner.event_payloads import (
    PAYLOAD_MODELS,
    MessageQueuedPayload,
    TurnResumedPayload,
    TurnStartedPayload,
    TurnSuspendedPayload,
    payload_of,
)
from agent_runner.events import MESSAGE_EVENT_TYPES
from agent_runner.ids import queued_turn_id
from tests.unit.agent_runner.turn_kit import MISSHAPEN_EVENTS, TICKET_FORM, EventLog, FakeClock, ticket_scenario


def test_every_turn_event_type_has_a_payload_model_that_starts_with_status_and_version() -> None:
    assert set(PAYLOAD_MODELS) == set(AgentEventType)
    for event_type, model in PAYLOAD_MODELS.items():
        if event_type in MESSAGE_EVENT_TYPES:
            # A queued message's events come before its turn exists: no turn status to stamp.
            assert not {"status", "version"} & set(model.model_fields)
        else:
            assert {"status", "version"} <= set(model.model_fields)


def test_an_event_whose_data_misses_a_field_of_its_type_is_refused_and_flagged_by_the_event_log() -> None:
    event = AgentEvent(type=AgentEventType.TOOL_STARTED, turn_id="t", data={"status": "RUNNING", "version": 1})
    with pytest.raises(ValidationError):
        payload_of(event)
    EventLog()(event)
    assert [flagged for flagged, _ in MISSHAPEN_EVENTS] == [event]
    MISSHAPEN_EVENTS.clear()


def test_a_form_suspension_event_carries_the_form_with_its_frozen_schema() -> None:
    scenario = ticket_scenario()
    turn = scenario.runner.run(scenario.agent, "my login is broken")
    [event] = scenario.events.of_type(AgentEventType.TURN_SUSPENDED)
    payload = payload_of(event)
    assert isinstance(payload, TurnSuspendedPayload)
    assert payload.form is not None and payload.form.schema_ == TICKET_FORM.schema
    assert event.data["form"] == {
        "key": TICKET_FORM.key,
        "description": TICKET_FORM.description,
        "schema": TICKET_FORM.schema,
    }
    assert event.data["form_key"] == TICKET_FORM.key
    assert event.data["correlation_id"] == "c1" == turn.suspension.correlation_id  # type: ignore[union-attr]
    assert event.data["message"] == turn.suspension.message  # type: ignore[union-attr]


@tool(requires_approval=True, sensitive=["token"])
def call_api(url: str, token: str) -> str:
    """Call an API."""
    return url


def test_an_approval_suspension_event_carries_the_call_with_its_sensitive_arguments_masked() -> None:
    call = ToolCall(id="c9", name="call_api", arguments={"url": "https://x", "token": "secret"})
    agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(tool_calls=[call])]), tools=[call_api])
    runner = AgentRunner(agent_loader=InMemoryAgentLoader([agent]))
    events = EventLog()
    runner.add_event_listener(events)
    runner.run(agent, "call it")
    [event] = events.of_type(AgentEventType.TURN_SUSPENDED)
    assert event.data["kind"] == "approval"
    assert event.data["tool_call"] == {
        "id": "c9",
        "name": "call_api",
        "arguments": {"url": "https://x", "token": "***"},
    }
    assert "secret" not in str(event.data)


def test_turn_resumed_has_one_shape_for_a_command_a_due_retry_and_a_child() -> None:
    clock = FakeClock()
    model = ScriptedChatModel([RecoverableError("timeout"), AiMessage(content="ok")])
    child = Agent(id="helper", chat_model=ScriptedChatModel([AiMessage(content="done")]))
    agent = Agent(id="a", chat_model=model, sub_agents=[child])
    runner = AgentRunner(turn_store=InMemoryAgentTurnStore(), clock=clock)
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(agent, "hi")
    assert turn.status is AgentTurnStatus.RETRY_SCHEDULED
    clock.advance(timedelta(hours=1).total_seconds())
    runner.run_until_blocked(runner.restore(turn.id))
    parent_model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="d1", name="helper", arguments={"task": "x"})]), AiMessage(content="ok")]
    )
    parent = Agent(id="p", chat_model=parent_model, sub_agents=[child])
    runner.run(parent, "delegate")
    resumed = [payload_of(e) for e in events.of_type(AgentEventType.TURN_RESUMED)]
    assert all(isinstance(p, TurnResumedPayload) for p in resumed)
    shapes = {tuple(e.data) for e in events.of_type(AgentEventType.TURN_RESUMED)}
    assert len(shapes) == 1 and len(resumed) == 2
    due, child_done = resumed
    assert isinstance(due, TurnResumedPayload) and isinstance(child_done, TurnResumedPayload)
    assert due.command is None and due.reason == "retry due" and due.attempt == 1
    assert child_done.command == "CHILD_COMPLETED" and child_done.child_turn_id is not None


def test_turn_started_names_the_user_message_and_the_parent_of_a_child() -> None:
    child = Agent(id="helper", chat_model=ScriptedChatModel([AiMessage(content="done")]))
    parent_model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="d1", name="helper", arguments={"task": "x"})]), AiMessage(content="ok")]
    )
    parent = Agent(id="p", chat_model=parent_model, sub_agents=[child])
    runner = AgentRunner()
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(parent, UserMessage(id="m-1", content="delegate"))
    started = [payload_of(e) for e in events.of_type(AgentEventType.TURN_STARTED)]
    assert all(isinstance(p, TurnStartedPayload) for p in started)
    root, sub = started
    assert isinstance(root, TurnStartedPayload) and isinstance(sub, TurnStartedPayload)
    assert (root.message_id, root.parent_turn_id, root.agent_id) == ("m-1", None, "p")
    assert (sub.parent_turn_id, sub.agent_id) == (turn.id, "helper")


def test_turn_started_links_a_turn_started_as_a_queued_message_and_no_other() -> None:
    agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi"), AiMessage(content="hi")]))
    runner = AgentRunner(agent_loader=InMemoryAgentLoader([agent]), chat_memory_provider=InMemoryChatMemoryProvider())
    events = EventLog()
    runner.add_event_listener(events)
    queued = queued_turn_id("c-1", "m-1")
    runner.start("a", UserMessage(id="m-1", content="hello"), conversation_id="c-1", turn_id=queued)
    # The same message id, under an id derived for another message: a direct start.
    other = queued_turn_id("c-2", "m-2")
    runner.start("a", UserMessage(id="m-1", content="hello"), conversation_id="c-2", turn_id=other)
    first, second = [payload_of(e) for e in events.of_type(AgentEventType.TURN_STARTED)]
    assert isinstance(first, TurnStartedPayload) and isinstance(second, TurnStartedPayload)
    assert (first.message_id, first.queued_message_id) == ("m-1", "m-1")
    assert (second.message_id, second.queued_message_id) == ("m-1", None)


def test_the_queued_turn_id_depends_on_the_conversation_and_the_message() -> None:
    ids = {queued_turn_id(c, m) for c in ("t1:c", "t2:c") for m in ("m", "m2")}
    assert len(ids) == 4 and all(len(i) == 32 for i in ids)
    assert queued_turn_id("t1:c", "m") == queued_turn_id("t1:c", "m")
    message = MessageQueuedPayload(message_id="m", sequence=3, ahead=1, content="x", agent_id=None)
    event = AgentEvent(type=AgentEventType.MESSAGE_QUEUED, turn_id="t", data=message.model_dump(mode="json"))
    assert payload_of(event) == message


def test_a_resume_command_event_keeps_its_reason_and_metadata() -> None:
    scenario = ticket_scenario()
    turn = scenario.runner.run(scenario.agent, "broken")
    turn = scenario.runner.resume(
        turn.id, AgentResumeCommand.user_input("c1", {"affected_system": "x", "impact_scope": "ONE_USER"})
    )
    command = AgentResumeCommand.reject_tool("c2", reason="not now").with_metadata("approverId", "u-1")
    scenario.runner.resume(turn.id, command)
    last = scenario.events.of_type(AgentEventType.TURN_RESUMED)[-1]
    assert last.data["reason"] == "not now" and last.data["metadata"] == {"approverId": "u-1"}
    assert last.data["tool_call_id"] == "c2" and last.data["command"] == "REJECT_TOOL"


def test_progress_that_is_not_json_is_dropped_and_the_tool_still_succeeds() -> None:
    @tool
    def slow() -> str:
        """Report progress twice."""
        context = AgentToolContext.current()
        context.report_progress({"at": object()})
        context.report_progress({"done": [1, [2, "x"]]})
        return "ok"

    call = ToolCall(id="p1", name="slow", arguments={})
    agent = Agent(
        id="a", chat_model=ScriptedChatModel([AiMessage(tool_calls=[call]), AiMessage(content="fine")]), tools=[slow]
    )
    runner = AgentRunner()
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(agent, "go")
    assert turn.status is AgentTurnStatus.COMPLETED
    assert [e.data["progress"] for e in events.of_type(AgentEventType.TOOL_PROGRESS)] == [{"done": [1, [2, "x"]]}]
