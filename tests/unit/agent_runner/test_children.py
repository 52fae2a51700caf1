"""Child turns: delegation to sub-agents, waiting for them, failures, approvals, cancel and usage."""

from __future__ import annotations

import pytest

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    Budget,
    ChatRequest,
    ChatResponse,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    ScriptedChatModel,
    SuspensionType,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)
from tests.helpers.scenarios import deploy
from tests.unit.agent_runner.turn_kit import EventLog, RecordingStore, protocol_violations, tool_messages

S = AgentTurnStatus


def _echo_agent(agent_id: str, tokens: int = 0) -> Agent:
    """A sub-agent that answers the delegated request at once."""

    def answer(request: ChatRequest) -> ChatResponse:
        delegated = request.messages[-1].content
        return ChatResponse(
            message=AiMessage(content=f"{agent_id} did: {delegated}"), usage=Usage(output_tokens=tokens)
        )

    return Agent(id=agent_id, chat_model=ScriptedChatModel(answer))


def _approving_agent(agent_id: str = "deployer") -> Agent:
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="x1", name="deploy", arguments={"service": "api"})]),
            AiMessage(content="deploy done"),
        ]
    )
    return Agent(id=agent_id, chat_model=model, tools=[deploy])


def _children(runner: AgentRunner, parent: AgentTurn) -> list[AgentTurn]:
    return [runner.turn_store.load(link.child_turn_id) for link in runner.turn_store.load(parent.id).children]


def _lead(
    sub_agents: list[Agent], calls: list[ToolCall], *, budget: Budget | None = None
) -> tuple[Agent, ScriptedChatModel]:
    model = ScriptedChatModel(
        [
            ChatResponse(message=AiMessage(tool_calls=calls), usage=Usage(input_tokens=10)),
            ChatResponse(message=AiMessage(content="all done"), usage=Usage(input_tokens=10)),
        ]
    )
    return Agent(id="lead", chat_model=model, sub_agents=sub_agents, budget=budget or Budget()), model


def test_delegating_to_three_sub_agents_runs_three_children_and_feeds_their_outputs_back_in_call_order() -> None:
    # Given: a lead agent that delegates to three sub-agents in one response, in a conversation
    lead, model = _lead(
        [_echo_agent("alpha"), _echo_agent("beta"), _echo_agent("gamma")],
        [
            ToolCall(id="d1", name="gamma", arguments={"task": "third thing"}),
            ToolCall(id="d2", name="alpha", arguments={"task": "first thing"}),
            ToolCall(id="d3", name="beta", arguments={"task": "second thing"}),
        ],
    )
    provider = InMemoryChatMemoryProvider()
    runner = AgentRunner(chat_memory_provider=provider)
    events = EventLog()
    runner.add_event_listener(events)
    # When: the turn runs
    parent = runner.run(lead, "do three things", conversation_id="c-1")
    # Then: the parent completed after reading one ToolMessage per call, in call order, holding each output
    assert parent.status is S.COMPLETED and parent.final_output == "all done"
    assert [(m.tool_call_id, m.content, m.is_error) for m in tool_messages(parent)] == [
        ("d1", "gamma did: third thing", False),
        ("d2", "alpha did: first thing", False),
        ("d3", "beta did: second thing", False),
    ]
    assert model.calls == 2 and protocol_violations(parent.messages) == []
    # And the children are linked to the parent and its root, start from the delegated text, and have no conversation
    children = _children(runner, parent)
    assert [c.agent_id for c in children] == ["gamma", "alpha", "beta"]
    for child in children:
        assert child.parent_turn_id == parent.id and child.root_turn_id == parent.id
        assert child.conversation_id is None
        assert child.status is S.COMPLETED
        assert isinstance(child.messages[0], UserMessage)
    assert [c.messages[0].content for c in children] == ["third thing", "first thing", "second thing"]
    assert parent.root_turn_id == parent.id
    assert {e.root_turn_id for e in events.events} == {parent.id}
    # And only the parent's messages reached the conversation
    assert len(runner.turn_store.list_turns(conversation_id="c-1")) == 1
    memory = provider("c-1")
    assert [m.content for m in memory.get_messages(100) if isinstance(m, UserMessage)] == ["do three things"]
    assert [m.id for m in memory.get_messages(100)] == [m.id for m in parent.messages]


def test_a_child_that_fails_becomes_an_error_tool_message_in_the_parent() -> None:
    broken = Agent(id="broken", chat_model=ScriptedChatModel([ValueError("model exploded")]))
    lead, _ = _lead(
        [broken, _echo_agent("alpha")],
        [
            ToolCall(id="d1", name="broken", arguments={"task": "try"}),
            ToolCall(id="d2", name="alpha", arguments={"task": "work"}),
        ],
    )
    runner = AgentRunner()
    parent = runner.run(lead, "go")
    assert parent.status is S.COMPLETED
    failed, ok = tool_messages(parent)
    assert failed.tool_call_id == "d1" and failed.is_error
    assert "model exploded" in failed.content
    assert (ok.tool_call_id, ok.content, ok.is_error) == ("d2", "alpha did: work", False)
    assert [c.status for c in _children(runner, parent)] == [S.FAILED, S.COMPLETED]


def test_a_parent_waits_for_a_child_that_needs_approval_and_completes_once_it_is_approved() -> None:
    # Given: a lead delegating to a quick sub-agent and to one that needs an approval
    lead, model = _lead(
        [_echo_agent("alpha"), _approving_agent()],
        [
            ToolCall(id="d1", name="alpha", arguments={"task": "quick"}),
            ToolCall(id="d2", name="deployer", arguments={"task": "deploy api"}),
        ],
    )
    runner = AgentRunner()
    # When: the turn runs
    parent = runner.run(lead, "go")
    # Then: the parent waits for its child, which waits for approval
    assert parent.status is S.WAITING_FOR_CHILD
    assert parent.suspension is not None and parent.suspension.type is SuspensionType.CHILD_AGENT
    quick, waiting = _children(runner, parent)
    assert quick.status is S.COMPLETED and waiting.status is S.WAITING_FOR_APPROVAL
    assert model.calls == 1
    # When: the child's call is approved
    child = runner.resume(waiting.id, AgentResumeCommand.approve_tool("x1"))
    # Then: the child completed and the parent went on to completion with both outputs
    assert child.status is S.COMPLETED
    finished = runner.turn_store.load(parent.id)
    assert finished.status is S.COMPLETED and model.calls == 2
    assert [m.content for m in tool_messages(finished)] == ["alpha did: quick", "deploy done"]


def test_child_completed_for_a_child_that_has_not_ended_is_rejected() -> None:
    lead, _ = _lead([_approving_agent()], [ToolCall(id="d1", name="deployer", arguments={"task": "deploy"})])
    runner = AgentRunner()
    parent = runner.run(lead, "go")
    [child] = _children(runner, parent)
    with pytest.raises(InvalidResumeCommand):
        runner.resume(parent.id, AgentResumeCommand.child_completed(child.id))
    with pytest.raises(InvalidResumeCommand):
        runner.resume(parent.id, AgentResumeCommand.child_completed("not-a-child"))
    assert runner.turn_store.load(parent.id) == parent


def test_cancelling_the_parent_cancels_its_children() -> None:
    lead, _ = _lead(
        [_approving_agent("one"), _approving_agent("two")],
        [
            ToolCall(id="d1", name="one", arguments={"task": "a"}),
            ToolCall(id="d2", name="two", arguments={"task": "b"}),
        ],
    )
    runner = AgentRunner()
    parent = runner.run(lead, "go")
    assert parent.status is S.WAITING_FOR_CHILD
    cancelled = runner.cancel(parent.id)
    assert cancelled.status is S.CANCELLED
    assert [c.status for c in _children(runner, parent)] == [S.CANCELLED, S.CANCELLED]
    assert [m.tool_call_id for m in tool_messages(cancelled)] == ["d1", "d2"]
    assert protocol_violations(cancelled.messages) == []
    assert runner.turn_store.load(parent.id).status is S.CANCELLED


def test_child_usage_counts_into_the_parent_usage() -> None:
    lead, _ = _lead(
        [_echo_agent("alpha", tokens=40), _echo_agent("beta", tokens=7)],
        [
            ToolCall(id="d1", name="alpha", arguments={"task": "a"}),
            ToolCall(id="d2", name="beta", arguments={"task": "b"}),
        ],
    )
    parent = AgentRunner().run(lead, "go")
    assert parent.status is S.COMPLETED
    assert parent.usage.total_tokens == 10 + 40 + 7 + 10


def test_child_usage_counts_against_the_parent_budget() -> None:
    # Given: a parent allowed 30 tokens whose child uses 100
    lead, model = _lead(
        [_echo_agent("alpha", tokens=100)],
        [ToolCall(id="d1", name="alpha", arguments={"task": "a"})],
        budget=Budget(max_total_tokens=30),
    )
    # When: the turn runs
    parent = AgentRunner().run(lead, "go")
    # Then: the parent ended over budget before calling its model again
    assert parent.status is S.BUDGET_EXCEEDED
    assert parent.usage.total_tokens == 110
    assert model.calls == 1
    assert protocol_violations(parent.messages) == []


def test_a_delegation_with_wrong_arguments_is_answered_with_an_error_tool_message() -> None:
    lead, _ = _lead([_echo_agent("alpha")], [ToolCall(id="d1", name="alpha", arguments={"topic": "x"})])
    runner = AgentRunner()
    parent = runner.run(lead, "go")
    [message] = tool_messages(parent)
    assert message.is_error and message.tool_call_id == "d1"
    assert runner.turn_store.load(parent.id).children == []
    assert parent.status is S.COMPLETED


def test_the_parent_reads_child_outputs_as_tool_messages_in_its_next_model_request() -> None:
    lead, model = _lead([_echo_agent("alpha")], [ToolCall(id="d1", name="alpha", arguments={"task": "a"})])
    AgentRunner().run(lead, "go")
    last = model.requests[1].messages[-1]
    assert isinstance(last, ToolMessage) and last.content == "alpha did: a"


def test_a_cancelled_child_becomes_an_error_tool_message_and_the_parent_goes_on() -> None:
    # Given: a parent waiting for a child that waits for approval
    lead, model = _lead([_approving_agent()], [ToolCall(id="d1", name="deployer", arguments={"task": "deploy"})])
    runner = AgentRunner()
    parent = runner.run(lead, "go")
    [child] = _children(runner, parent)
    # When: the child alone is cancelled
    assert runner.cancel(child.id).status is S.CANCELLED
    # Then: the parent got an error ToolMessage for the delegation and answered
    finished = runner.turn_store.load(parent.id)
    [message] = tool_messages(finished)
    assert message.tool_call_id == "d1" and message.is_error
    assert finished.status is S.COMPLETED and model.calls == 2


def test_commands_other_than_child_completed_are_rejected_while_waiting_for_a_child() -> None:
    lead, _ = _lead([_approving_agent()], [ToolCall(id="d1", name="deployer", arguments={"task": "deploy"})])
    runner = AgentRunner()
    parent = runner.run(lead, "go")
    for command in (
        AgentResumeCommand.approve_tool("d1"),
        AgentResumeCommand.reject_tool("d1"),
        AgentResumeCommand.retry(),
        AgentResumeCommand.user_input("hurry up"),
    ):
        with pytest.raises(InvalidResumeCommand):
            runner.resume(parent.id, command)
    assert runner.turn_store.load(parent.id) == parent


def test_every_snapshot_of_a_delegation_round_trips_through_json() -> None:
    # Given: a parent with a finished child and a child waiting for approval, on a recording store
    store = RecordingStore()
    lead, _ = _lead(
        [_echo_agent("alpha"), _approving_agent()],
        [
            ToolCall(id="d1", name="alpha", arguments={"task": "quick"}),
            ToolCall(id="d2", name="deployer", arguments={"task": "deploy api"}),
        ],
    )
    runner = AgentRunner(turn_store=store)
    parent = runner.run(lead, "go")
    runner.resume(_children(runner, parent)[1].id, AgentResumeCommand.approve_tool("x1"))
    # Then: parent and child snapshots, child links included, survive JSON exactly
    assert any(t.children for t in store.saved)
    for snapshot in store.saved:
        assert AgentTurn.model_validate_json(snapshot.model_dump_json()) == snapshot
