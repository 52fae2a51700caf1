"""In-memory backends: turn store compare-and-swap, active conversation turns, chat memory, agent loader."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_runner import (
    ActionStatus,
    Agent,
    AgentActionMessage,
    AgentConversationBusyException,
    AgentLoader,
    AgentNotFound,
    AgentTurn,
    AgentTurnStatus,
    AgentTurnStore,
    AiMessage,
    ChatMemory,
    ChatModel,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryChatMemory,
    InMemoryChatMemoryProvider,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    TurnNotFound,
    UserMessage,
    VersionConflictError,
)
from tests.unit.agent_runner.turn_kit import START

S = AgentTurnStatus


def _turn(turn_id: str = "t-1", conversation_id: str | None = None, **changes: object) -> AgentTurn:
    return AgentTurn(
        id=turn_id,
        agent_id="a",
        root_turn_id=turn_id,
        conversation_id=conversation_id,
        messages=[UserMessage(content="hi")],
        **changes,  # type: ignore[arg-type]
    )


def test_in_memory_backends_implement_the_exported_protocols() -> None:
    assert isinstance(InMemoryAgentTurnStore(), AgentTurnStore)
    assert isinstance(InMemoryChatMemory("c"), ChatMemory)
    assert isinstance(InMemoryAgentLoader([]), AgentLoader)
    assert isinstance(ScriptedChatModel([]), ChatModel)


def test_save_with_minus_one_creates_version_zero_and_each_save_adds_one() -> None:
    store = InMemoryAgentTurnStore()
    first = store.save(_turn(), -1)
    second = store.save(first.model_copy(update={"status": S.RUNNING}), first.version)
    assert (first.version, second.version) == (0, 1)
    assert store.load("t-1") == second


def test_save_with_a_stale_version_raises_and_keeps_the_newer_snapshot() -> None:
    # Given: a turn saved twice
    store = InMemoryAgentTurnStore()
    v0 = store.save(_turn(), -1)
    v1 = store.save(v0.model_copy(update={"steps": 1}), 0)
    # When: a writer still holding version 0 saves
    with pytest.raises(VersionConflictError) as caught:
        store.save(v0.model_copy(update={"steps": 99}), 0)
    # Then: the conflict names both versions and the store still holds version 1
    assert (caught.value.expected_version, caught.value.actual_version) == (0, 1)
    assert store.load("t-1") == v1


def test_creating_a_turn_that_exists_raises_version_conflict() -> None:
    store = InMemoryAgentTurnStore()
    existing = store.save(_turn(), -1)
    with pytest.raises(VersionConflictError):
        store.save(existing, -1)
    assert store.load("t-1") == existing


def test_saving_an_unknown_turn_with_a_version_raises_version_conflict() -> None:
    with pytest.raises(VersionConflictError):
        InMemoryAgentTurnStore().save(_turn(), 3)


def test_loading_an_unknown_turn_raises_turn_not_found() -> None:
    with pytest.raises(TurnNotFound):
        InMemoryAgentTurnStore().load("nope")


def test_the_store_itself_refuses_a_second_active_turn_in_a_conversation() -> None:
    # Given: an active turn in conversation c
    store = InMemoryAgentTurnStore()
    first = store.save(_turn("t-1", "c"), -1)
    assert store.find_active_turn("c") == first
    # When / Then: a second non-terminal turn in c is refused with the active one named
    with pytest.raises(AgentConversationBusyException) as caught:
        store.save(_turn("t-2", "c"), -1)
    assert (caught.value.conversation_id, caught.value.active_turn_id, caught.value.status) == ("c", "t-1", S.READY)
    with pytest.raises(TurnNotFound):
        store.load("t-2")


def test_a_terminal_turn_frees_its_conversation() -> None:
    store = InMemoryAgentTurnStore()
    first = store.save(_turn("t-1", "c"), -1)
    store.save(first.model_copy(update={"status": S.COMPLETED}), first.version)
    assert store.find_active_turn("c") is None
    second = store.save(_turn("t-2", "c"), -1)
    assert store.find_active_turn("c") == second
    assert store.find_active_turn("other") is None


def test_request_cancel_sets_a_flag_without_a_version_change_and_a_later_save_keeps_it() -> None:
    store = InMemoryAgentTurnStore()
    saved = store.save(_turn(), -1)
    flagged = store.request_cancel("t-1")
    assert flagged.cancel_requested and flagged.version == saved.version
    # A writer that did not see the flag saves: the flag stays set
    after = store.save(saved.model_copy(update={"steps": 1}), saved.version)
    assert after.cancel_requested


def test_list_runnable_returns_ready_turns_and_due_retries_only() -> None:
    store = InMemoryAgentTurnStore()
    store.save(_turn("ready"), -1)
    store.save(_turn("due", status=S.RETRY_SCHEDULED, next_retry_at=START - timedelta(seconds=1)), -1)
    store.save(_turn("later", status=S.RETRY_SCHEDULED, next_retry_at=START + timedelta(seconds=60)), -1)
    store.save(_turn("waiting", status=S.WAITING_FOR_USER), -1)
    store.save(_turn("done", status=S.COMPLETED), -1)
    assert {ref.turn_id for ref in store.list_runnable(START)} == {"ready", "due"}


def test_chat_memory_returns_the_newest_messages_of_both_kinds_oldest_first() -> None:
    memory = InMemoryChatMemory("c")
    card = AgentActionMessage(turn_id="t", action_id="c1", tool_name="x", summary="x()")
    memory.append([UserMessage(content="1"), AiMessage(content="2"), card, UserMessage(content="3")])
    assert [m.id for m in memory.get_messages(2)] == [card.id, memory.get_messages(1)[0].id]
    assert len(memory.get_messages(10)) == 4
    assert memory.get_messages(0) == []


def test_model_messages_skip_page_messages_and_never_start_with_an_orphan_tool_message() -> None:
    # Given: an assistant call whose answer would be the first message of a 3-message window
    memory = InMemoryChatMemory("c")
    memory.append(
        [
            UserMessage(content="q"),
            AiMessage(tool_calls=[ToolCall(id="t1", name="lookup", arguments={})]),
            ToolMessage(tool_call_id="t1", tool_name="lookup", content="r"),
            AgentActionMessage(turn_id="t", action_id="c1", tool_name="x", summary="x()"),
            AiMessage(content="a"),
            UserMessage(content="q2"),
        ]
    )
    # When / Then: the orphan ToolMessage is dropped from the front; page messages never count
    window = memory.get_model_messages(3)
    assert [m.role for m in window] == ["assistant", "user"]
    assert [m.role for m in memory.get_model_messages(4)] == ["assistant", "tool", "assistant", "user"]
    assert memory.get_model_messages(0) == []


def test_append_is_idempotent_by_message_id() -> None:
    memory = InMemoryChatMemory("c")
    first, second = UserMessage(content="1"), AiMessage(content="2")
    memory.append([first])
    memory.append([first, second])
    memory.append([second, first])
    assert [m.id for m in memory.get_messages(10)] == [first.id, second.id]


def test_update_is_a_compare_and_swap_on_the_page_message_version() -> None:
    # Given: a stored page message at version 0
    memory = InMemoryChatMemory("c")
    card = AgentActionMessage(turn_id="t", action_id="c1", tool_name="x", summary="x()")
    memory.append([card])
    # When: it is updated at version 0
    updated = memory.update(card.model_copy(update={"status": ActionStatus.APPROVED}), 0)
    # Then: it is stored with version 1; an update still expecting 0 raises and changes nothing
    assert (updated.status, updated.version) == (ActionStatus.APPROVED, 1)  # type: ignore[union-attr]
    with pytest.raises(VersionConflictError):
        memory.update(card.model_copy(update={"status": ActionStatus.REJECTED}), 0)
    assert memory.get(card.id) == updated
    assert len(memory.get_messages(10)) == 1


def test_the_memory_provider_returns_one_memory_per_conversation() -> None:
    provider = InMemoryChatMemoryProvider()
    assert provider("a") is provider("a")
    assert provider("a") is not provider("b")
    assert provider("a").conversation_id == "a"


def test_the_agent_loader_finds_agents_by_id_and_version_and_defaults_to_the_latest() -> None:
    v1, v2 = Agent(id="support-bot", version="1"), Agent(id="support-bot", version="2")
    sub = Agent(id="sub")
    loader = InMemoryAgentLoader([v1, v2, Agent(id="lead", sub_agents=[sub])])
    assert loader.load("support-bot", "1") is v1
    assert loader.load("support-bot") is v2
    assert loader.load("sub") is sub
    with pytest.raises(AgentNotFound):
        loader.load("support-bot", "3")
    with pytest.raises(AgentNotFound):
        loader.load("missing")
