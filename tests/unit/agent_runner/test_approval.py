"""Tool approval: suspend before the call, approve runs the saved call, reject tells the model."""

from __future__ import annotations

import pytest

from agent_runner import (
    Agent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    Phase,
    ScriptedChatModel,
    SuspensionType,
    Tool,
    ToolCall,
    tool,
)
from tests.unit.agent_runner.turn_kit import EventLog, protocol_violations, tool_messages

S = AgentTurnStatus


class Bank:
    """Tools with side effects that record what ran."""

    def __init__(self) -> None:
        self.transfers: list[tuple[str, int]] = []
        self.lookups: list[str] = []

        @tool(requires_approval=True)
        def transfer(to: str, amount: int) -> str:
            """Move money."""
            self.transfers.append((to, amount))
            return f"sent {amount} to {to}"

        @tool
        def balance(account: str) -> str:
            """Read a balance."""
            self.lookups.append(account)
            return "100"

        self.tools: list[Tool] = [transfer, balance]


def _setup(script: list[AiMessage]) -> tuple[AgentRunner, ScriptedChatModel, Bank, Agent, EventLog]:
    bank = Bank()
    model = ScriptedChatModel(script)
    agent = Agent(id="banker", chat_model=model, tools=bank.tools)
    runner = AgentRunner()
    events = EventLog()
    runner.add_event_listener(events)
    return runner, model, bank, agent, events


def test_a_tool_that_requires_approval_suspends_before_running_with_the_call_id() -> None:
    # Given: a model asking for a transfer
    runner, model, bank, agent, _ = _setup(
        [AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5})])]
    )
    # When: the turn runs
    turn = runner.run(agent, "pay bob")
    # Then: it waits for approval of that call, in TOOLS, and nothing was sent
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None
    assert (turn.suspension.type, turn.suspension.correlation_id) == (SuspensionType.TOOL_APPROVAL, "t1")
    assert turn.suspension.resume_phase is Phase.TOOLS
    assert [c.id for c in turn.pending_tool_calls] == ["t1"]
    assert bank.transfers == []


def test_approve_runs_the_saved_call_with_its_arguments_once_without_asking_the_model_again() -> None:
    runner, model, bank, agent, events = _setup(
        [
            AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5})]),
            AiMessage(content="Paid."),
        ]
    )
    turn = runner.run(agent, "pay bob")
    # When: the call is approved, with audit metadata
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("t1").with_metadata("approverId", "u-100"))
    # Then: the saved call ran once, the model was called once more for the answer only
    assert bank.transfers == [("bob", 5)]
    assert turn.status is S.COMPLETED and turn.final_output == "Paid."
    assert model.calls == 2
    [resumed] = events.of_type(AgentEventType.TURN_RESUMED)
    assert resumed.data["metadata"] == {"approverId": "u-100"}
    assert resumed.data["tool_call_id"] == "t1"


@pytest.mark.parametrize(
    ("metadata", "recorded"),
    [({"reason": "within the daily limit", "approverId": "u-100"}, "within the daily limit"), ({}, None)],
    ids=["with-reason", "without"],
)
def test_an_approval_records_the_reason_of_its_metadata_on_the_decision(
    metadata: dict[str, str], recorded: str | None
) -> None:
    runner, _, _, agent, _ = _setup(
        [
            AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5})]),
            AiMessage(content="Paid."),
        ]
    )
    turn = runner.run(agent, "pay bob")
    command = AgentResumeCommand.approve_tool("t1")
    for key, value in metadata.items():
        command = command.with_metadata(key, value)

    turn = runner.resume(turn.id, command)

    [action] = turn.page_actions
    assert action.decision.get("reason") == recorded
    assert action.decision.get("decided_by") == metadata.get("approverId")


def test_reject_writes_a_tool_message_with_the_reason_and_then_the_model_answers() -> None:
    # Given: a turn waiting for approval of a transfer
    runner, model, bank, agent, _ = _setup(
        [
            AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5})]),
            AiMessage(content="Not paid."),
        ]
    )
    turn = runner.run(agent, "pay bob")
    # When: it is rejected with a reason
    turn = runner.resume(turn.id, AgentResumeCommand.reject_tool("t1", reason="over the limit"))
    # Then: nothing was sent, the ToolMessage carries the reason, and the model answered from it
    assert bank.transfers == []
    [message] = tool_messages(turn)
    assert message.tool_call_id == "t1" and message.is_error and "over the limit" in message.content
    assert turn.status is S.COMPLETED and turn.final_output == "Not paid."
    assert model.calls == 2
    assert model.requests[1].messages[-1] == message
    # And the call was not requested again by the model
    assert [c.id for m in turn.messages if isinstance(m, AiMessage) for c in m.tool_calls] == ["t1"]
    assert protocol_violations(turn.messages) == []


def test_reject_moves_on_to_the_next_pending_call_of_the_same_response() -> None:
    # Given: a transfer to approve followed by a balance lookup
    runner, model, bank, agent, _ = _setup(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5}),
                    ToolCall(id="b1", name="balance", arguments={"account": "main"}),
                ]
            ),
            AiMessage(content="Balance is 100."),
        ]
    )
    turn = runner.run(agent, "pay bob then check")
    # When: the transfer is rejected
    turn = runner.resume(turn.id, AgentResumeCommand.reject_tool("t1"))
    # Then: the lookup still ran, answers are in call order, one model call followed
    assert bank.transfers == [] and bank.lookups == ["main"]
    assert [m.tool_call_id for m in tool_messages(turn)] == ["t1", "b1"]
    assert model.calls == 2 and turn.status is S.COMPLETED


def test_each_of_two_approval_calls_suspends_in_call_order() -> None:
    runner, model, bank, agent, _ = _setup(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5}),
                    ToolCall(id="t2", name="transfer", arguments={"to": "ann", "amount": 7}),
                ]
            ),
            AiMessage(content="Done."),
        ]
    )
    turn = runner.run(agent, "pay both")
    assert turn.suspension is not None and turn.suspension.correlation_id == "t1"
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("t1"))
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.correlation_id == "t2"
    assert bank.transfers == [("bob", 5)]
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("t2"))
    assert bank.transfers == [("bob", 5), ("ann", 7)]
    assert turn.status is S.COMPLETED and model.calls == 2


def test_an_approval_call_with_invalid_arguments_is_answered_with_an_error_and_never_offered_for_approval() -> None:
    runner, model, bank, agent, _ = _setup(
        [
            AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": "lots"})]),
            AiMessage(content="Oops."),
        ]
    )
    turn = runner.run(agent, "pay bob")
    assert turn.status is S.COMPLETED
    [message] = tool_messages(turn)
    assert message.is_error and "amount" in message.content
    assert bank.transfers == []


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_does_not_count_as_a_model_iteration(decision: str) -> None:
    runner, model, bank, agent, _ = _setup(
        [
            AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 5})]),
            AiMessage(content="ok"),
        ]
    )
    turn = runner.run(agent, "pay bob")
    command = AgentResumeCommand.approve_tool("t1") if decision == "approve" else AgentResumeCommand.reject_tool("t1")
    turn = runner.resume(turn.id, command)
    assert turn.model_iterations == 2 == model.calls
