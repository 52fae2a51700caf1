"""The `ChatMemory` contract, run against the in-memory, SQLite and PostgreSQL memories."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent_runner import (
    ActionStatus,
    AgentActionMessage,
    AgentFormMessage,
    AiMessage,
    StoreError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    VersionConflictError,
)
from agent_runner.messages import AnyMessage
from agent_runner.persistence import ChatMemoryProvider


def approval(message_id: str = "card-1", **fields: object) -> AgentActionMessage:
    data: dict[str, object] = {
        "id": message_id,
        "turn_id": "t-1",
        "action_id": "call-1",
        "tool_name": "create_ticket",
        "summary": "create_ticket(affected_system='CRM')",
        "arguments": {"affected_system": "CRM", "token": "***"},
    }
    data.update(fields)
    return AgentActionMessage.model_validate(data)


def form(message_id: str = "form-1") -> AgentFormMessage:
    return AgentFormMessage(
        id=message_id,
        turn_id="t-1",
        action_id="call-2",
        form_key="support_ticket_details",
        description="Tell us more",
        form_schema={"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}},
    )


def conversation() -> list[AnyMessage]:
    call = ToolCall(id="call-1", name="lookup", arguments={"order": "1001"})
    return [
        UserMessage(id="u1", content="where is order 1001?"),
        AiMessage(id="a1", tool_calls=[call]),
        approval(),
        ToolMessage(id="t1", tool_call_id="call-1", tool_name="lookup", content="shipped"),
        AiMessage(id="a2", content="It shipped."),
        form(),
        UserMessage(id="u2", content="thanks"),
    ]


def ids(messages: Sequence[AnyMessage]) -> list[str]:
    return [m.id for m in messages]


def test_messages_come_back_newest_window_oldest_first(chat_memory_provider: ChatMemoryProvider) -> None:
    memory = chat_memory_provider("c-1")
    memory.append(conversation())
    assert memory.get_messages(100) == conversation()
    assert ids(memory.get_messages(3)) == ["a2", "form-1", "u2"]
    assert memory.get_messages(0) == []


def test_model_window_skips_page_messages_and_a_leading_orphan_tool_message(
    chat_memory_provider: ChatMemoryProvider,
) -> None:
    memory = chat_memory_provider("c-1")
    memory.append(conversation())
    assert ids(memory.get_model_messages(100)) == ["u1", "a1", "t1", "a2", "u2"]
    # The newest 3 model messages are t1, a2, u2: t1's AiMessage is outside, so it is dropped
    assert ids(memory.get_model_messages(3)) == ["a2", "u2"]
    assert ids(memory.get_model_messages(4)) == ["a1", "t1", "a2", "u2"]
    assert memory.get_model_messages(0) == []
    assert all(m.model_visible for m in memory.get_model_messages(100))


def test_append_is_idempotent_by_message_id(chat_memory_provider: ChatMemoryProvider) -> None:
    memory = chat_memory_provider("c-1")
    memory.append(conversation()[:3])
    # A retried projection sends the same messages again, plus new ones
    memory.append(conversation())
    memory.append(conversation()[2:])
    assert memory.get_messages(100) == conversation()
    # A duplicate inside one batch is stored once, at its first position
    memory.append([UserMessage(id="u3", content="first"), UserMessage(id="u3", content="second")])
    assert memory.get_messages(1) == [UserMessage(id="u3", content="first")]
    # Skipped ids never change the stored message
    memory.append([UserMessage(id="u1", content="rewritten")])
    assert memory.get("u1") == UserMessage(id="u1", content="where is order 1001?")
    memory.append([])


def test_conversations_are_isolated(chat_memory_provider: ChatMemoryProvider) -> None:
    first = chat_memory_provider("c-1")
    second = chat_memory_provider("c-2")
    first.append([UserMessage(id="same", content="in c-1")])
    second.append([UserMessage(id="same", content="in c-2"), SystemMessage(id="s", content="sys")])
    assert first.get_messages(10) == [UserMessage(id="same", content="in c-1")]
    assert ids(second.get_messages(10)) == ["same", "s"]
    assert chat_memory_provider("c-3").get_messages(10) == []
    assert chat_memory_provider("c-1").get("same") == UserMessage(id="same", content="in c-1")


def test_two_tenants_using_one_conversation_id_never_meet(chat_memory_provider: ChatMemoryProvider) -> None:
    acme, globex = chat_memory_provider("c-1", tenant_id="acme"), chat_memory_provider("c-1", tenant_id="globex")
    acme.append([UserMessage(id="same", content="from acme")])
    globex.append([UserMessage(id="same", content="from globex")])
    assert chat_memory_provider("c-1", tenant_id="acme").get_messages(10) == [
        UserMessage(id="same", content="from acme")
    ]
    assert globex.get("same") == UserMessage(id="same", content="from globex")
    assert chat_memory_provider("c-1").get_messages(10) == []


def test_get_finds_a_message_by_id(chat_memory_provider: ChatMemoryProvider) -> None:
    memory = chat_memory_provider("c-1")
    memory.append(conversation())
    assert memory.get("form-1") == form()
    stored = memory.get("form-1")
    assert isinstance(stored, AgentFormMessage) and list(stored.schema["properties"]) == ["z", "a"]
    assert memory.get("missing") is None


def test_update_swaps_a_page_message_and_bumps_its_version(chat_memory_provider: ChatMemoryProvider) -> None:
    memory = chat_memory_provider("c-1")
    memory.append(conversation())
    card = memory.get("card-1")
    assert isinstance(card, AgentActionMessage) and card.get_actions() == ["APPROVE", "REJECT"]
    updated = memory.update(card.model_copy(update={"status": ActionStatus.APPROVED}), 0)
    assert isinstance(updated, AgentActionMessage)
    assert (updated.version, updated.status, updated.get_actions()) == (1, ActionStatus.APPROVED, [])
    assert memory.get("card-1") == updated
    # In place: the order and the count of messages do not change
    assert ids(memory.get_messages(100)) == ids(conversation())
    form_message = memory.get("form-1")
    assert isinstance(form_message, AgentFormMessage)
    submitted = memory.update(form_message.model_copy(update={"status": ActionStatus.SUBMITTED}), 0)
    assert isinstance(submitted, AgentFormMessage)
    assert memory.get("form-1") == submitted and submitted.version == 1


def test_a_stale_update_is_refused_and_changes_nothing(chat_memory_provider: ChatMemoryProvider) -> None:
    memory = chat_memory_provider("c-1")
    memory.append([approval()])
    approved = memory.update(approval(status=ActionStatus.APPROVED), 0)
    # When a second decision arrives, made on version 0
    with pytest.raises(VersionConflictError) as raised:
        memory.update(approval(status=ActionStatus.REJECTED), 0)
    assert (raised.value.expected_version, raised.value.actual_version) == (0, 1)
    assert memory.get("card-1") == approved


def test_update_refuses_unknown_and_model_messages(chat_memory_provider: ChatMemoryProvider) -> None:
    memory = chat_memory_provider("c-1")
    memory.append([UserMessage(id="u1", content="hi"), approval()])
    with pytest.raises(StoreError):
        memory.update(approval("not-there"), 0)
    with pytest.raises(StoreError):
        memory.update(UserMessage(id="u1", content="edited"), 0)
    with pytest.raises(StoreError):
        memory.update(form("card-1"), 0)  # same id, other kind of page message
    assert memory.get("u1") == UserMessage(id="u1", content="hi")
    assert memory.get("card-1") == approval()
    # A page message of another conversation is not found here
    chat_memory_provider("c-2").append([approval("elsewhere")])
    with pytest.raises(StoreError):
        memory.update(approval("elsewhere"), 0)
