"""`ui_messages`: a conversation timeline as the UI messages `useChat` shows, in the cases a live server rarely reaches."""

from __future__ import annotations

from typing import Any

from agent_runner import (
    ActionStatus,
    AgentActionMessage,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    AnyMessage,
    SuspensionType,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from workers.api.protocols.ui_messages import UNDECIDED_ERROR, ui_messages


def _show(call: ToolCall) -> dict[str, Any]:
    return dict(call.arguments)


def _card(turn_id: str, call_id: str, status: ActionStatus, reason: str | None = None) -> AgentActionMessage:
    return AgentActionMessage(
        id=f"card-{call_id}",
        turn_id=turn_id,
        action_id=call_id,
        tool_name="deploy",
        summary="deploy",
        status=status,
        reason=reason,
    )


def _tool_part(message: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in message["parts"] if p["type"] == "tool-deploy")


def test_a_call_approved_and_still_running_is_approval_responded() -> None:
    messages: list[AnyMessage] = [
        UserMessage("deploy", id="u-1"),
        AiMessage(tool_calls=[ToolCall("c-1", "deploy", {"service": "x"})], id="a-1"),
        _card("t-1", "c-1", ActionStatus.APPROVED, "fine"),
    ]
    (_, assistant) = ui_messages(messages, _show, active=None, conversation_id="c")
    assert assistant["id"] == "t-1"
    assert _tool_part(assistant) == {
        "type": "tool-deploy",
        "toolCallId": "c-1",
        "state": "approval-responded",
        "input": {"service": "x"},
        "approval": {"id": "c-1", "approved": True, "reason": "fine"},
    }


def test_a_call_nobody_decided_before_the_turn_ended_is_an_error_not_a_card_to_click() -> None:
    messages: list[AnyMessage] = [
        UserMessage("deploy", id="u-1"),
        AiMessage(tool_calls=[ToolCall("c-1", "deploy", {})], id="a-1"),
        _card("t-1", "c-1", ActionStatus.CANCELLED),
    ]
    (_, assistant) = ui_messages(messages, _show, active=None, conversation_id="c")
    part = _tool_part(assistant)
    assert part["state"] == "output-error" and part["errorText"] == UNDECIDED_ERROR and "approval" not in part


def test_the_active_turn_names_its_message_and_shows_the_question_it_waits_for() -> None:
    # Given a turn (no cards) that answered with text and now waits for a plain-text answer
    history: list[AnyMessage] = [UserMessage("hi", id="u-0"), AiMessage("hello", id="a-0")]
    own: list[AnyMessage] = [UserMessage("book it", id="u-1"), AiMessage("Which day?", id="a-1")]
    question = AgentSuspension(type=SuspensionType.USER_INPUT, message="Which day?")
    active = AgentTurn(
        id="t-1",
        agent_id="assistant",
        conversation_id="c",
        status=AgentTurnStatus.WAITING_FOR_USER,
        messages=[*history, *own],  # type: ignore[list-item]
        suspension=question,
    )
    shown = ui_messages([*history, *own], _show, active=active, conversation_id="c")
    # Then the earlier turn's message keeps its first message's id, the active one has the turn's
    assert [m["id"] for m in shown] == ["u-0", "a-0", "u-1", "t-1"]
    assert shown[3]["parts"][-1] == {"type": "data-question", "data": {"message": "Which day?"}}
    assert shown[3]["metadata"] == {"turnId": "t-1", "conversationId": "c"}
    assert "metadata" not in shown[1]


def test_a_turn_split_by_the_users_answer_gives_its_id_to_its_last_message_only() -> None:
    messages: list[AnyMessage] = [
        UserMessage("deploy", id="u-1"),
        AiMessage(tool_calls=[ToolCall("c-1", "deploy", {})], id="a-1"),
        _card("t-1", "c-1", ActionStatus.REJECTED, "why?"),
        ToolMessage("c-1", "deploy", "rejected: why?", is_error=True, id="r-1"),
        UserMessage("because", id="u-2"),
        AiMessage(tool_calls=[ToolCall("c-2", "deploy", {})], id="a-2"),
        _card("t-1", "c-2", ActionStatus.PENDING),
    ]
    shown = ui_messages(messages, _show, active=None, conversation_id="c")
    assert [m["id"] for m in shown] == ["u-1", "a-1", "u-2", "t-1"]
    assert _tool_part(shown[1])["state"] == "output-denied"
    assert _tool_part(shown[3])["state"] == "approval-requested"


def test_a_page_that_starts_inside_a_turn_skips_results_of_calls_it_does_not_show() -> None:
    messages: list[AnyMessage] = [
        ToolMessage("c-0", "deploy", "done", id="r-0"),
        AiMessage("deployed", id="a-1"),
        UserMessage("thanks", id="u-2"),
    ]
    shown = ui_messages(messages, _show, active=None, conversation_id="c")
    assert shown[0] == {
        "id": "r-0",
        "role": "assistant",
        "parts": [{"type": "step-start"}, {"type": "text", "text": "deployed", "state": "done"}],
    }
    assert shown[1]["role"] == "user"
