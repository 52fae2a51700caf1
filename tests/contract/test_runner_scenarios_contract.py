"""End-to-end runner scenarios through every store, with a fresh runner after every suspension.

Each phase of a scenario uses a new `AgentRunner` with its own loader and, for the SQL
backends, its own store and chat memory objects (new engines, nothing remembered), as a
separate web request or worker process would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import store
from agent_runner import (
    ActionStatus,
    Agent,
    AgentActionMessage,
    AgentConversationBusyException,
    AgentEvent,
    AgentEventType,
    AgentFormDefinition,
    AgentFormMessage,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    InMemoryAgentLoader,
    RecoverableError,
    ScriptedChatModel,
    SuspensionType,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from agent_runner.event_payloads import payload_of
from agent_runner.persistence import AgentTurnStore, ChatMemoryProvider, EventLog, EventScope

S = AgentTurnStatus

RunnerFactory = Callable[[Agent], AgentRunner]


@pytest.fixture
def fresh_runner(
    database_url: str | None, turn_store: AgentTurnStore, chat_memory_provider: ChatMemoryProvider
) -> Iterator[RunnerFactory]:
    """Returns a new runner on the same database each time it is called.

    Afterwards, every event the runners delivered, and every event stored for their turn
    trees, must have the shape of its type's payload model.
    """
    opened: list[store.SqlAgentTurnStore | store.SqlChatMemoryProvider] = []
    delivered: list[AgentEvent] = []

    def make(agent: Agent) -> AgentRunner:
        if database_url is None:
            turns, memories = turn_store, chat_memory_provider
        else:
            sql_turns = store.SqlAgentTurnStore(database_url)
            sql_memories = store.SqlChatMemoryProvider(database_url)
            opened.extend([sql_turns, sql_memories])
            turns, memories = sql_turns, sql_memories
        runner = AgentRunner(turn_store=turns, agent_loader=InMemoryAgentLoader([agent]), chat_memory_provider=memories)
        runner.add_event_listener(delivered.append)
        return runner

    try:
        yield make
        assert isinstance(turn_store, EventLog)
        durable = {e.event_id for e in delivered if e.type.is_durable}
        roots = sorted({event.root_turn_id or event.turn_id for event in delivered})
        deadline = time.monotonic() + 10
        while True:
            # On PostgreSQL an event becomes readable once the transactions begun before its
            # save have ended (other clients of the server included): wait for them.
            stored = [e for root in roots for e in turn_store.read_events(EventScope.tree(root), limit=1000)]
            if {e.event_id for e in stored} == durable or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert {e.event_id for e in stored} == durable
        for event in [*delivered, *stored]:
            payload_of(event)  # raises on an event without the shape of its type
    finally:
        for item in opened:
            item.close()


def test_an_approved_tool_call_completes_the_turn_across_runners(
    fresh_runner: RunnerFactory, chat_memory_provider: ChatMemoryProvider
) -> None:
    created: list[dict[str, Any]] = []

    @tool(requires_approval=True)
    def create_ticket(affected_system: str, impact_scope: str) -> str:
        """Create a support ticket."""
        created.append({"affected_system": affected_system, "impact_scope": impact_scope})
        return "TICKET-1"

    call = ToolCall(
        id="call-1", name="create_ticket", arguments={"affected_system": "CRM", "impact_scope": "ALL_USERS"}
    )
    model = ScriptedChatModel([AiMessage(tool_calls=[call]), AiMessage(content="Ticket TICKET-1 created ✓")])
    agent = Agent(id="support", instructions="Help.", chat_model=model, tools=[create_ticket])

    # Given a conversation turn that waits for approval
    waiting = fresh_runner(agent).run("support", "CRM is down for everyone", conversation_id="c-1")
    assert waiting.status is S.WAITING_FOR_APPROVAL
    assert waiting.suspension is not None and waiting.suspension.correlation_id == "call-1"
    assert created == []

    # Then the conversation is busy for another runner
    with pytest.raises(AgentConversationBusyException) as busy:
        fresh_runner(agent).run("support", "hello?", conversation_id="c-1")
    assert busy.value.active_turn_id == waiting.id

    # When another runner restores it and the approval arrives
    runner = fresh_runner(agent)
    restored = runner.restore(waiting.id)
    assert restored.pending_tool_calls == [call]
    done = runner.resume(waiting.id, AgentResumeCommand.approve_tool("call-1").with_metadata("approverId", "u-100"))

    # Then the saved call ran once, as the model made it, and the turn completed
    assert done.status is S.COMPLETED
    assert done.final_output == "Ticket TICKET-1 created ✓"
    assert created == [{"affected_system": "CRM", "impact_scope": "ALL_USERS"}]
    assert model.calls == 2
    assert fresh_runner(agent).restore(done.id) == done

    # And ChatMemory shows the history with the approval card decided in place
    history = chat_memory_provider("c-1").get_messages(100)
    assert [m.role for m in history] == ["user", "assistant", "agent_action", "tool", "assistant"]
    card = history[2]
    assert isinstance(card, AgentActionMessage) and card.status is ActionStatus.APPROVED and card.version == 1
    assert isinstance(history[3], ToolMessage) and history[3].content == "TICKET-1"

    # And the next turn of the conversation may start, with the history window
    model_2 = ScriptedChatModel([AiMessage(content="You're welcome")])
    agent_2 = Agent(id="support", instructions="Help.", chat_model=model_2, tools=[create_ticket])
    follow_up = fresh_runner(agent_2).run("support", "thanks", conversation_id="c-1")
    assert follow_up.status is S.COMPLETED
    sent = [m.role for m in model_2.requests[0].messages]
    assert sent == ["system", "user", "assistant", "tool", "assistant", "user"]


def test_a_form_is_frozen_and_its_data_resumes_the_turn_across_runners(
    fresh_runner: RunnerFactory, chat_memory_provider: ChatMemoryProvider
) -> None:
    ticket_form = AgentFormDefinition(
        key="support_ticket_details",
        description="Details of the ticket",
        schema={
            "type": "object",
            "properties": {"affected_system": {"type": "string"}, "impact_scope": {"enum": ["ONE_USER", "ALL_USERS"]}},
            "required": ["affected_system", "impact_scope"],
        },
    )
    ask = ToolCall(id="call-f", name="request_user_input", arguments={"formKey": "support_ticket_details"})
    model = ScriptedChatModel([AiMessage(tool_calls=[ask]), AiMessage(content="Thanks, noted.")])
    agent = Agent(id="support", chat_model=model, tools=[AgentUserInputTool(forms=[ticket_form])])

    waiting = fresh_runner(agent).run("support", "I need help", conversation_id="c-form")
    assert waiting.status is S.WAITING_FOR_USER
    assert waiting.suspension is not None and waiting.suspension.type is SuspensionType.USER_INPUT
    assert waiting.suspension.form is not None and waiting.suspension.form.schema == ticket_form.schema

    data = {"affected_system": "ERP — 会計", "impact_scope": "ONE_USER"}
    done = fresh_runner(agent).resume(waiting.id, AgentResumeCommand.user_input("call-f", data))
    assert done.status is S.COMPLETED
    tool_message = next(m for m in done.messages if isinstance(m, ToolMessage))
    assert tool_message.tool_call_id == "call-f" and "会計" in tool_message.content
    page = chat_memory_provider("c-form").get_messages(100)
    forms = [m for m in page if isinstance(m, AgentFormMessage)]
    assert len(forms) == 1 and forms[0].status is ActionStatus.SUBMITTED


def test_a_scheduled_retry_resumes_at_the_same_phase_across_runners(fresh_runner: RunnerFactory) -> None:
    model = ScriptedChatModel([RecoverableError("rate limited", retry_after=30), AiMessage(content="finally")])
    agent = Agent(id="support", chat_model=model)

    scheduled = fresh_runner(agent).run("support", "hi")
    assert scheduled.status is S.RETRY_SCHEDULED and scheduled.next_retry_at is not None
    runner = fresh_runner(agent)
    assert [r.turn_id for r in runner.turn_store.list_runnable(scheduled.next_retry_at)] == [scheduled.id]
    done = runner.resume(scheduled.id, AgentResumeCommand.retry())
    assert done.status is S.COMPLETED and done.final_output == "finally"
    assert fresh_runner(agent).restore(scheduled.id) == done


def test_cancelling_a_waiting_turn_closes_it_out_and_frees_the_conversation(fresh_runner: RunnerFactory) -> None:
    @tool(requires_approval=True)
    def wipe_disk(disk: str) -> str:
        """Wipe a disk."""
        raise AssertionError("never approved, never run")

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="call-w", name="wipe_disk", arguments={"disk": "sda"})])]
    )
    agent = Agent(id="ops", chat_model=model, tools=[wipe_disk])
    waiting = fresh_runner(agent).run("ops", "clean up", conversation_id="c-ops")
    assert waiting.status is S.WAITING_FOR_APPROVAL

    cancelled = fresh_runner(agent).cancel(waiting.id)
    assert cancelled.status is S.CANCELLED
    closing = [m for m in cancelled.messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in closing] == ["call-w"]
    assert isinstance(cancelled.messages[-1], AiMessage)
    assert fresh_runner(agent).turn_store.find_active_turn("c-ops") is None


def test_a_running_turn_cancelled_from_another_runner_ends_with_the_given_reason(fresh_runner: RunnerFactory) -> None:
    agents: list[Agent] = []

    @tool
    def hang_up() -> str:
        """Cancel the running turn from another runner, as another process would."""
        turn_id = AgentToolContext.current().turn_id
        flagged = fresh_runner(agents[0]).cancel(turn_id, reason="the customer hung up")
        assert (flagged.status, flagged.cancel_requested) == (S.RUNNING, True)
        return "hung up"

    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="call-h", name="hang_up", arguments={}),
                    ToolCall(id="call-n", name="hang_up", arguments={}),
                ]
            )
        ]
    )
    agent = Agent(id="ops", chat_model=model, tools=[hang_up])
    agents.append(agent)
    # When the first tool cancels its own RUNNING turn with a reason
    runner = fresh_runner(agent)
    ended = runner.run("ops", "call me", conversation_id="c-hang")
    # Then the stepping runner ends it with that reason: error, close-out and event
    reason = "the customer hung up"
    assert (ended.status, ended.error) == (S.CANCELLED, reason)
    closing = [m for m in ended.messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in closing] == ["call-h", "call-n"]
    last = ended.messages[-1]
    assert reason in closing[1].content and isinstance(last, AiMessage) and reason in (last.content or "")
    assert isinstance(runner.turn_store, EventLog)
    events = runner.turn_store.read_events(EventScope.tree(ended.id))
    [event] = [e for e in events if e.type is AgentEventType.TURN_CANCELLED]
    assert event.data["error"] == reason


def test_child_turns_are_stored_and_complete_the_parent(fresh_runner: RunnerFactory) -> None:
    researcher = Agent(
        id="researcher",
        chat_model=ScriptedChatModel(lambda request: AiMessage(content=f"found: {request.messages[-1].content}")),
    )
    calls = [
        ToolCall(id="d-1", name="researcher", arguments={"task": "prices"}),
        ToolCall(id="d-2", name="researcher", arguments={"task": "stock"}),
    ]
    parent_model = ScriptedChatModel([AiMessage(tool_calls=calls), AiMessage(content="summary")])
    parent = Agent(id="lead", chat_model=parent_model, sub_agents=[researcher])

    done = fresh_runner(parent).run("lead", "research")
    assert done.status is S.COMPLETED
    runner = fresh_runner(parent)
    children = runner.turn_store.list_turns(parent_turn_id=done.id)
    assert sorted(c.final_output or "" for c in children) == ["found: prices", "found: stock"]
    assert all(c.root_turn_id == done.id and c.conversation_id is None for c in children)
    outputs = {m.tool_call_id: m.content for m in done.messages if isinstance(m, ToolMessage)}
    assert outputs == {"d-1": "found: prices", "d-2": "found: stock"}
    assert runner.restore(done.id) == done


def test_history_from_chat_memory_feeds_the_next_turn(fresh_runner: RunnerFactory) -> None:
    model = ScriptedChatModel(lambda request: AiMessage(content=f"seen {len(request.messages)}"))
    agent = Agent(id="echo", chat_model=model, max_attached_messages=3)
    for text in ["one", "two", "three"]:
        turn = fresh_runner(agent).run("echo", UserMessage(content=text), conversation_id="c-echo")
        assert turn.status is S.COMPLETED
    # The third turn saw the newest 3 messages of the conversation plus its own user message
    assert [m.content for m in model.requests[-1].messages] == ["seen 1", "two", "seen 3", "three"]
