"""Messages, enums, suspensions and resume commands: construction and JSON round trips."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from agent_runner import (
    ActionStatus,
    AgentActionMessage,
    AgentEventType,
    AgentFormMessage,
    AgentResumeCommand,
    AgentSuspension,
    AgentTurnStatus,
    AiMessage,
    AnyMessage,
    Phase,
    SuspensionType,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)

M = TypeVar("M", bound=BaseModel)


def unchecked(model: type[M]) -> Callable[..., M]:
    """`model`'s constructor as the runtime accepts it: positional fields and aliases as keywords.

    Type checkers derive a keyword-only signature with field names from a pydantic model, so
    they reject `UserMessage("hi")` and `AgentFormMessage(schema=...)` although both work.
    """
    return model


def test_user_message_takes_its_content_positionally_or_by_keyword() -> None:
    # Given / When: the two spellings
    positional = unchecked(UserMessage)("hi")
    keyword = UserMessage(content="hi")
    # Then: same content and role
    assert positional.content == keyword.content == "hi"
    assert positional.role == keyword.role == "user"


def test_tool_message_takes_call_id_tool_name_and_content_positionally() -> None:
    message = unchecked(ToolMessage)("c1", "t", "x")
    assert (message.tool_call_id, message.tool_name, message.content, message.is_error) == ("c1", "t", "x", False)
    assert message.role == "tool"


def test_tool_call_takes_id_name_and_arguments_positionally() -> None:
    call = unchecked(ToolCall)("c1", "lookup", {"q": "1001"})
    assert (call.id, call.name, call.arguments) == ("c1", "lookup", {"q": "1001"})


def test_system_and_ai_messages_have_their_roles_and_defaults() -> None:
    assert SystemMessage(content="be brief").role == "system"
    ai = AiMessage()
    assert (ai.role, ai.content, ai.tool_calls) == ("assistant", None, [])
    assert AiMessage(content="done").content == "done"


def test_a_positional_argument_given_twice_is_rejected() -> None:
    with pytest.raises(TypeError):
        unchecked(UserMessage)("hi", content="again")


def test_too_many_positional_arguments_are_rejected() -> None:
    with pytest.raises(TypeError):
        unchecked(UserMessage)("a", "b")


def test_every_message_gets_a_distinct_generated_id_when_none_is_given() -> None:
    # Given: two identical messages without ids
    first, second = UserMessage(content="hi"), UserMessage(content="hi")
    # Then: both have ids, and they differ; an explicit id is kept
    assert first.id and second.id and first.id != second.id
    assert UserMessage(content="hi", id="m-1").id == "m-1"


def test_model_messages_are_model_visible_and_page_messages_are_not() -> None:
    action = AgentActionMessage(turn_id="t", action_id="c1", tool_name="x", summary="x()")
    form = AgentFormMessage(turn_id="t", action_id="c2", form_key="k", form_schema={"type": "object"})
    assert all(
        m.model_visible
        for m in (
            SystemMessage(content="s"),
            UserMessage(content="u"),
            AiMessage(content="a"),
            ToolMessage(tool_call_id="c", tool_name="t", content="r"),
        )
    )
    assert not action.model_visible
    assert not form.model_visible


def test_every_message_kind_round_trips_through_json_by_role() -> None:
    # Given: one message of each kind
    adapter: TypeAdapter[list[AnyMessage]] = TypeAdapter(list[AnyMessage])
    messages: list[AnyMessage] = [
        SystemMessage(content="s"),
        UserMessage(content="u"),
        AiMessage(
            content="a", tool_calls=[ToolCall(id="c1", name="lookup", arguments={"q": 1, "nested": {"x": [1, 2]}})]
        ),
        ToolMessage(tool_call_id="c1", tool_name="lookup", content="r", is_error=True),
        AgentActionMessage(turn_id="t", action_id="c1", tool_name="lookup", summary="lookup(q=1)", version=3),
        AgentFormMessage(turn_id="t", action_id="c2", form_key="k", form_schema={"type": "object"}),
    ]
    # When: they go through JSON and back
    restored = adapter.validate_json(adapter.dump_json(messages))
    # Then: they are equal and of the same classes
    assert restored == messages
    assert [type(m) for m in restored] == [type(m) for m in messages]


def test_messages_are_immutable() -> None:
    message = UserMessage(content="hi")
    with pytest.raises(ValidationError):
        message.content = "changed"  # type: ignore[misc]


@pytest.mark.parametrize("enum", [AgentTurnStatus, Phase, SuspensionType, AgentEventType, ActionStatus])
def test_public_enums_are_str_enums_whose_values_equal_their_names(enum: type[StrEnum]) -> None:
    assert issubclass(enum, StrEnum)
    assert all(member.value == member.name for member in enum)


def test_exactly_the_six_ending_statuses_are_terminal() -> None:
    terminal = {s for s in AgentTurnStatus if s.is_terminal}
    assert terminal == {
        AgentTurnStatus.COMPLETED,
        AgentTurnStatus.FAILED,
        AgentTurnStatus.CANCELLED,
        AgentTurnStatus.MAX_ITERATIONS_REACHED,
        AgentTurnStatus.MAX_STEPS_REACHED,
        AgentTurnStatus.BUDGET_EXCEEDED,
    }


def test_action_message_offers_approve_and_reject_only_while_pending() -> None:
    pending = AgentActionMessage(turn_id="t", action_id="c1", tool_name="x", summary="x()")
    assert pending.status is ActionStatus.PENDING
    assert pending.get_actions() == ["APPROVE", "REJECT"]
    for decided in (ActionStatus.APPROVED, ActionStatus.REJECTED):
        assert pending.model_copy(update={"status": decided}).get_actions() == []


def test_form_message_offers_submit_only_while_pending_and_exposes_its_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    form = unchecked(AgentFormMessage)(turn_id="t", action_id="c1", form_key="k", schema=schema)
    assert form.schema == schema
    assert form.get_actions() == ["SUBMIT"]
    assert form.model_copy(update={"status": ActionStatus.SUBMITTED}).get_actions() == []


def test_plain_text_suspension_is_user_input_without_correlation_id() -> None:
    suspension = AgentSuspension.user_input("please give the order number")
    assert suspension.type is SuspensionType.USER_INPUT
    assert suspension.correlation_id is None
    assert suspension.form is None
    assert suspension.message == "please give the order number"


def test_with_metadata_returns_a_copy_and_leaves_the_command_unchanged() -> None:
    # Given: an approval command
    command = AgentResumeCommand.approve_tool("c1")
    # When: metadata is added twice
    tagged = command.with_metadata("approverId", "u-100").with_metadata("channel", "web")
    # Then: the copy has both entries, the original none
    assert tagged.metadata == {"approverId": "u-100", "channel": "web"}
    assert command.metadata == {}
    assert tagged.tool_call_id == "c1"
    with pytest.raises(ValidationError):
        command.tool_call_id = "c2"  # type: ignore[misc]


def test_user_input_command_distinguishes_plain_text_from_form_data() -> None:
    text = AgentResumeCommand.user_input("O-1001")
    form = AgentResumeCommand.user_input("c1", {"field": 1})
    assert (text.content, text.tool_call_id, text.data) == ("O-1001", None, None)
    assert (form.content, form.tool_call_id, form.data) == (None, "c1", {"field": 1})
