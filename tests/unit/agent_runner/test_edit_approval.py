"""Edit decisions: a person changes the arguments of a call waiting for approval, and the edited call runs."""

from __future__ import annotations

import pytest

from agent_runner import (
    ActionStatus,
    Agent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    InvalidResumeCommand,
    ScriptedChatModel,
    ToolCall,
    tool,
)
from tests.unit.agent_runner.turn_kit import EventLog, tool_messages

S = AgentTurnStatus


class Bank:
    """A transfer tool that needs approval and records what it sent."""

    def __init__(self) -> None:
        self.transfers: list[tuple[str, int]] = []

        @tool(requires_approval=True)
        def transfer(to: str, amount: int) -> str:
            """Move money."""
            self.transfers.append((to, amount))
            return f"sent {amount} to {to}"

        self.transfer = transfer


def _setup(script: list[AiMessage]) -> tuple[AgentRunner, ScriptedChatModel, Bank, Agent, EventLog]:
    bank = Bank()
    model = ScriptedChatModel(script)
    agent = Agent(id="banker", chat_model=model, tools=[bank.transfer])
    runner = AgentRunner()
    events = EventLog()
    runner.add_event_listener(events)
    return runner, model, bank, agent, events


TRANSFER = AiMessage(tool_calls=[ToolCall(id="t1", name="transfer", arguments={"to": "bob", "amount": 500})])


def test_an_edited_call_runs_with_the_edited_arguments_and_the_model_is_not_asked_again() -> None:
    # Given: a transfer of 500 waiting for approval
    runner, model, bank, agent, events = _setup([TRANSFER, AiMessage(content="Paid.")])
    turn = runner.run(agent, "pay bob")
    # When: a person edits the amount, saying who and why
    command = (
        AgentResumeCommand.edit_tool("t1", {"to": "bob", "amount": 50})
        .with_metadata("decided_by", "u-7")
        .with_metadata("reason", "over the limit")
    )
    turn = runner.resume(turn.id, command)
    # Then: the edited call ran once, and the model was called only for the answer
    assert bank.transfers == [("bob", 50)]
    assert [m.content for m in tool_messages(turn)] == ["sent 50 to bob"]
    assert turn.status is S.COMPLETED and model.calls == 2
    # And the decision records who edited and why; the resume event says it was an edit
    [action] = turn.page_actions
    assert action.status is ActionStatus.APPROVED
    assert action.decision["decided_by"] == "u-7" and action.decision["reason"] == "over the limit"
    # The model's own message keeps what it asked for; the call that ran is the edited one
    asked = turn.messages[1]
    assert isinstance(asked, AiMessage) and asked.tool_calls[0].arguments["amount"] == 500
    [resumed] = events.of_type(AgentEventType.TURN_RESUMED)
    assert resumed.data["command"] == "EDIT_TOOL" and resumed.data["metadata"]["decided_by"] == "u-7"


@pytest.mark.parametrize(
    ("arguments", "pointer"),
    [
        ({"to": "bob", "amount": "lots"}, "/amount"),
        ({"to": "bob"}, "/amount"),
        ({"to": "bob", "amount": 5, "memo": 1}, ""),
    ],
    ids=["wrong-type", "missing", "extra"],
)
def test_edited_arguments_that_fail_the_tool_schema_are_refused_and_change_nothing(
    arguments: dict[str, object], pointer: str
) -> None:
    runner, _, bank, agent, _ = _setup([TRANSFER, AiMessage(content="Paid.")])
    turn = runner.run(agent, "pay bob")
    with pytest.raises(InvalidResumeCommand) as raised:
        runner.resume(turn.id, AgentResumeCommand.edit_tool("t1", arguments))
    assert raised.value.errors and any(getattr(e, "pointer", None) == pointer for e in raised.value.errors)
    stored = runner.turn_store.load(turn.id)
    assert stored.status is S.WAITING_FOR_APPROVAL and stored.version == turn.version
    assert stored.pending_tool_calls[0].arguments == {"to": "bob", "amount": 500} and bank.transfers == []


def test_an_edit_for_another_call_is_refused() -> None:
    runner, _, _, agent, _ = _setup([TRANSFER])
    turn = runner.run(agent, "pay bob")
    with pytest.raises(InvalidResumeCommand):
        runner.resume(turn.id, AgentResumeCommand.edit_tool("t9", {"to": "bob", "amount": 1}))
