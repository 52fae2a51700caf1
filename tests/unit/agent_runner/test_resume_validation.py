"""Resume commands that do not fit the suspension are rejected and change nothing."""

from __future__ import annotations

import pytest

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    InvalidResumeCommand,
    ScriptedChatModel,
    ToolCall,
    TurnNotFound,
    tool,
)
from tests.unit.agent_runner.turn_kit import VALID_TICKET, TicketScenario, ticket_scenario

S = AgentTurnStatus


def _waiting_for_form() -> tuple[TicketScenario, AgentTurn]:
    sc = ticket_scenario()
    return sc, sc.runner.run(sc.agent, "open an incident ticket")


def _waiting_for_approval() -> tuple[TicketScenario, AgentTurn]:
    sc, turn = _waiting_for_form()
    return sc, sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))


def _assert_rejected_without_change(sc: TicketScenario, turn_id: str, command: AgentResumeCommand) -> None:
    before = sc.store.load(turn_id)
    saves = len(sc.store.saved)
    calls = sc.model.calls
    with pytest.raises(InvalidResumeCommand):
        sc.runner.resume(turn_id, command)
    with pytest.raises(InvalidResumeCommand):
        sc.runner.submit_resume(turn_id, command)
    assert sc.store.load(turn_id) == before
    assert sc.store.load(turn_id).version == before.version
    assert len(sc.store.saved) == saves
    assert sc.model.calls == calls


WRONG_FOR_FORM: dict[str, AgentResumeCommand] = {
    "approve": AgentResumeCommand.approve_tool("c1"),
    # Rejecting the call declines its form (see test_forms_flow); another call's id does not fit.
    "decline of another call": AgentResumeCommand.reject_tool("c0"),
    "retry": AgentResumeCommand.retry(),
    "child": AgentResumeCommand.child_completed("some-child"),
    "plain text": AgentResumeCommand.user_input("just text"),
    "stale call id": AgentResumeCommand.user_input("c0", VALID_TICKET),
    "invalid data": AgentResumeCommand.user_input("c1", {"affected_system": "x", "impact_scope": "EVERYONE"}),
}


@pytest.mark.parametrize("name", list(WRONG_FOR_FORM))
def test_a_command_that_does_not_fit_a_form_suspension_is_rejected_and_changes_nothing(name: str) -> None:
    sc, turn = _waiting_for_form()
    _assert_rejected_without_change(sc, turn.id, WRONG_FOR_FORM[name])


WRONG_FOR_APPROVAL: dict[str, AgentResumeCommand] = {
    "form data": AgentResumeCommand.user_input("c2", VALID_TICKET),
    "plain text": AgentResumeCommand.user_input("yes please"),
    "retry": AgentResumeCommand.retry(),
    "stale call id": AgentResumeCommand.approve_tool("c1"),
    "unknown call id": AgentResumeCommand.reject_tool("zzz"),
}


@pytest.mark.parametrize("name", list(WRONG_FOR_APPROVAL))
def test_a_command_that_does_not_fit_an_approval_suspension_is_rejected_and_changes_nothing(name: str) -> None:
    sc, turn = _waiting_for_approval()
    _assert_rejected_without_change(sc, turn.id, WRONG_FOR_APPROVAL[name])


def test_resume_of_a_terminal_turn_is_rejected_and_changes_nothing() -> None:
    sc, turn = _waiting_for_approval()
    done = sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    assert done.status is S.COMPLETED
    _assert_rejected_without_change(sc, turn.id, AgentResumeCommand.approve_tool("c2"))


def test_a_duplicate_approval_is_rejected_and_changes_nothing() -> None:
    # Given: an approval already applied (the turn is RUNNING, not yet stepped)
    sc, turn = _waiting_for_approval()
    applied = sc.runner.submit_resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    assert applied.status is S.RUNNING
    # When / Then: the same approval again is rejected and the tool has not run
    _assert_rejected_without_change(sc, turn.id, AgentResumeCommand.approve_tool("c2"))
    assert sc.ticket_keys == []


def test_approving_an_already_approved_call_while_the_next_call_waits_is_rejected() -> None:
    # Given: two approval calls; the first was approved and ran, the turn waits on the second
    ran: list[str] = []

    @tool(requires_approval=True)
    def send(to: str) -> str:
        """Send."""
        ran.append(to)
        return "sent"

    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="s1", name="send", arguments={"to": "a"}),
                    ToolCall(id="s2", name="send", arguments={"to": "b"}),
                ]
            )
        ]
    )
    runner = AgentRunner()
    turn = runner.run(Agent(id="mailer", chat_model=model, tools=[send]), "go")
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("s1"))
    assert turn.suspension is not None and turn.suspension.correlation_id == "s2"
    # When: s1 is approved again
    with pytest.raises(InvalidResumeCommand):
        runner.resume(turn.id, AgentResumeCommand.approve_tool("s1"))
    # Then: nothing changed and s1 ran once
    assert runner.turn_store.load(turn.id) == turn
    assert ran == ["a"]


def test_a_decision_on_a_pending_call_that_is_not_the_one_waiting_is_rejected() -> None:
    # Given: two approval calls; the turn waits on the first, the second is pending behind it
    ran: list[str] = []

    @tool(requires_approval=True)
    def send(to: str) -> str:
        """Send."""
        ran.append(to)
        return "sent"

    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="s1", name="send", arguments={"to": "a"}),
                    ToolCall(id="s2", name="send", arguments={"to": "b"}),
                ]
            )
        ]
    )
    runner = AgentRunner()
    turn = runner.run(Agent(id="mailer", chat_model=model, tools=[send]), "go")
    assert [c.id for c in turn.pending_tool_calls] == ["s1", "s2"]
    # When / Then: deciding on s2 out of turn is refused and changes nothing
    for command in (AgentResumeCommand.approve_tool("s2"), AgentResumeCommand.reject_tool("s2")):
        with pytest.raises(InvalidResumeCommand):
            runner.resume(turn.id, command)
    assert runner.turn_store.load(turn.id) == turn
    assert ran == []


def test_form_data_for_a_plain_text_question_is_rejected_and_changes_nothing() -> None:
    runner = AgentRunner()
    turn = runner.start(
        Agent(id="orders", chat_model=ScriptedChatModel([AiMessage(content="ok")])), "where is my order?"
    )
    turn = runner.suspend(turn, AgentSuspension.user_input("please give the order number"))
    with pytest.raises(InvalidResumeCommand):
        runner.resume(turn.id, AgentResumeCommand.user_input("c1", {"order": "O-1001"}))
    assert runner.turn_store.load(turn.id) == turn


@pytest.mark.parametrize("state", ["ready", "running"])
def test_resume_of_a_turn_that_is_not_waiting_is_rejected(state: str) -> None:
    runner = AgentRunner()
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="x1", name="nothing", arguments={})]), AiMessage(content="ok")]
    )
    turn = runner.start(Agent(id="idle", chat_model=model), "go")
    if state == "running":
        turn = runner.step(turn).turn
        assert turn.status is S.RUNNING
    for command in (AgentResumeCommand.retry(), AgentResumeCommand.user_input("text")):
        with pytest.raises(InvalidResumeCommand):
            runner.resume(turn.id, command)
    assert runner.turn_store.load(turn.id) == turn


def test_resume_of_an_unknown_turn_raises_turn_not_found() -> None:
    with pytest.raises(TurnNotFound):
        AgentRunner().resume("nope", AgentResumeCommand.retry())


def test_invalid_resume_errors_name_the_turn() -> None:
    sc, turn = _waiting_for_form()
    with pytest.raises(InvalidResumeCommand) as caught:
        sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c1"))
    assert caught.value.turn_id == turn.id
