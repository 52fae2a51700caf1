"""Non-idempotent tools: a call whose outcome was not recorded is never re-run blindly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent_runner import (
    ActionStatus,
    Agent,
    AgentActionMessage,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    DefinitionError,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    Middleware,
    ScriptedChatModel,
    SuspensionType,
    Tool,
    ToolCall,
    ToolMessage,
    ToolOutcome,
)
from agent_runner.persistence import EventScope
from tests.unit.agent_runner.turn_kit import RecordingStore

S = AgentTurnStatus


class WorkerDied(BaseException):
    """Stands for a process killed mid-step: nothing after it runs, nothing catches it."""


class DieAfterBody(Middleware):
    """Kills the 'process' after the tool body returned, before its result is saved."""

    def __init__(self) -> None:
        self.armed = True

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        result = call_next(tool_call)
        if self.armed:
            self.armed = False
            raise WorkerDied
        return result


class Mailer:
    """A side effect without idempotency: every call sends one email."""

    def __init__(self, die_during: bool = False) -> None:
        self.sent: list[str] = []
        self.die_during = die_during

    def tool(self) -> Tool:
        def send_email(to: str) -> str:
            self.sent.append(to)
            if self.die_during:
                self.die_during = False
                raise WorkerDied
            return f"sent to {to}"

        return Tool(send_email, idempotent=False)


def _scenario(tool: Tool, middleware: list[Middleware] | None = None) -> tuple[AgentRunner, Agent, RecordingStore]:
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="mail-1", name="send_email", arguments={"to": "ops@example.com"})]),
            AiMessage(content="done"),
        ]
    )
    store = RecordingStore()
    runner = AgentRunner(
        turn_store=store, chat_memory_provider=InMemoryChatMemoryProvider(), middleware=middleware or []
    )
    return runner, Agent(id="mailer", chat_model=model, tools=[tool]), store


def _crash_then_recover(runner: AgentRunner, agent: Agent) -> AgentTurn:
    turn = runner.start(agent, "tell ops", conversation_id="c-1")
    with pytest.raises(WorkerDied):
        runner.run_until_blocked(turn)
    crashed = runner.turn_store.load(turn.id)
    assert crashed.started_call_ids == ["mail-1"]  # the start was saved before the body ran
    return runner.run_until_blocked(crashed)


@pytest.mark.parametrize("where", ["during the body", "after the body, before the result was saved"])
def test_without_reconcile_the_turn_asks_a_person(where: str) -> None:
    mailer = Mailer(die_during=where == "during the body")
    middleware: list[Middleware] = [] if mailer.die_during else [DieAfterBody()]
    runner, agent, store = _scenario(mailer.tool(), middleware)

    waiting = _crash_then_recover(runner, agent)

    assert waiting.status is S.WAITING_FOR_APPROVAL
    assert waiting.suspension is not None and waiting.suspension.type is SuspensionType.TOOL_OUTCOME_UNKNOWN
    assert waiting.suspension.is_outcome_unknown and waiting.suspension.metadata["reason"] == "outcome_unknown"
    assert mailer.sent == ["ops@example.com"]  # not re-run
    card = next(
        m
        for m in runner.chat_memory_provider("c-1").get_messages(20)  # type: ignore[misc]
        if isinstance(m, AgentActionMessage)
    )
    assert card.kind == "outcome_unknown" and card.get_actions() == ["RETRY", "MARK_DONE", "FAIL"]
    suspended = [e for e in store.read_events(EventScope.tree(waiting.id)) if e.type is AgentEventType.TURN_SUSPENDED]
    assert [(e.data["suspension_type"], e.data["kind"]) for e in suspended] == [
        ("TOOL_OUTCOME_UNKNOWN", "outcome_unknown")
    ]


@pytest.mark.parametrize(
    ("command", "emails", "content", "is_error"),
    [
        (AgentResumeCommand.approve_tool("mail-1"), 2, "sent to ops@example.com", False),
        (AgentResumeCommand.tool_result("mail-1", "delivered, id 42"), 1, "delivered, id 42", False),
        (AgentResumeCommand.reject_tool("mail-1", "bounced"), 1, None, True),
    ],
    ids=["retry", "mark-done", "fail"],
)
def test_each_choice_of_the_person_acts_exactly_as_chosen(
    command: AgentResumeCommand, emails: int, content: str | None, is_error: bool
) -> None:
    mailer = Mailer(die_during=True)
    runner, agent, _ = _scenario(mailer.tool())
    waiting = _crash_then_recover(runner, agent)

    done = runner.resume(waiting.id, command.with_metadata("decided_by", "u-7"))

    assert done.status is S.COMPLETED
    assert len(mailer.sent) == emails
    results = [m for m in done.messages if isinstance(m, ToolMessage)]
    assert len(results) == 1 and results[0].is_error is is_error
    if content is not None:
        assert results[0].content == content
    else:
        assert "bounced" in results[0].content
    assert done.started_call_ids == []
    action = next(a for a in done.page_actions if a.kind == "outcome_unknown")
    assert action.decision["decided_by"] == "u-7"
    assert action.status in (ActionStatus.APPROVED, ActionStatus.SUBMITTED, ActionStatus.REJECTED)


@pytest.mark.parametrize(
    ("outcome", "emails", "expected"),
    [
        (ToolOutcome.done("delivered earlier"), 1, S.COMPLETED),
        (ToolOutcome.not_done(), 2, S.COMPLETED),
        (ToolOutcome.unknown("the mail server does not say"), 1, S.WAITING_FOR_APPROVAL),
    ],
    ids=["done", "not-done", "unknown"],
)
def test_a_reconcile_function_settles_the_call(outcome: ToolOutcome, emails: int, expected: AgentTurnStatus) -> None:
    mailer = Mailer(die_during=True)
    tool = mailer.tool()
    asked: list[tuple[str, str]] = []

    @tool.reconcile
    def check(call: ToolCall, idempotency_key: str) -> ToolOutcome:
        asked.append((call.id, idempotency_key))
        return outcome

    runner, agent, _ = _scenario(tool)
    turn = _crash_then_recover(runner, agent)

    assert turn.status is expected
    assert len(mailer.sent) == emails
    assert asked == [("mail-1", f"{turn.id}:mail-1")]
    if outcome.state == "done":
        assert [m.content for m in turn.messages if isinstance(m, ToolMessage)] == ["delivered earlier"]
        completed = [e for e in runner.turn_store.read_events(EventScope.tree(turn.id))]  # type: ignore[attr-defined]
        assert any(e.type is AgentEventType.TOOL_COMPLETED and e.data.get("reconciled") for e in completed)


def test_a_reconcile_function_that_raises_leaves_the_call_to_a_person() -> None:
    mailer = Mailer(die_during=True)
    tool = mailer.tool()

    @tool.reconcile
    def check(call: ToolCall, idempotency_key: str) -> ToolOutcome:
        raise ConnectionError("mail API down")

    runner, agent, _ = _scenario(tool)
    turn = _crash_then_recover(runner, agent)
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and "ConnectionError: mail API down" in turn.suspension.message


def test_only_non_idempotent_tools_take_a_reconcile_function() -> None:
    tool = Tool(lambda: "x", name="read_only")
    with pytest.raises(DefinitionError, match="only @tool\\(idempotent=False\\) tools reconcile"):
        tool.reconcile(lambda call, key: ToolOutcome.not_done())


def test_tool_result_does_not_apply_to_an_ordinary_approval() -> None:
    def charge(amount: int) -> str:
        return "charged"

    tool = Tool(charge, requires_approval=True)
    model = ScriptedChatModel([AiMessage(tool_calls=[ToolCall(id="p1", name="charge", arguments={"amount": 5})])])
    runner = AgentRunner()
    turn = runner.run(Agent(id="a", chat_model=model, tools=[tool]), "pay")
    assert turn.status is S.WAITING_FOR_APPROVAL
    with pytest.raises(InvalidResumeCommand, match="tool_result settles only a call whose outcome is unknown"):
        runner.resume(turn.id, AgentResumeCommand.tool_result("p1", "made up"))


def test_an_idempotent_tool_costs_no_extra_save_and_a_non_idempotent_one_exactly_one() -> None:
    def saves_for(idempotent: bool) -> int:
        def send_email(to: str) -> str:
            return "ok"

        runner, agent, store = _scenario(Tool(send_email, idempotent=idempotent))
        runner.run(agent, "tell ops")
        return len(store.saved)

    assert saves_for(False) == saves_for(True) + 1
