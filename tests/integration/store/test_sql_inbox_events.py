"""The events of queued messages on SQLite and PostgreSQL: written with the inbox row, linked to the turn they start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentRunner,
    AiMessage,
    InMemoryAgentLoader,
    ScriptedChatModel,
    StoreError,
    VersionConflictError,
)
from agent_runner.ids import queued_turn_id, utcnow
from agent_runner.persistence import ConversationKey, EventScope
from store import Inbox, InboxStatus, SqlAgentTurnStore, SqlChatMemoryProvider
from store.schema import turn_events
from workers import inbox as inbox_module
from workers.inbox import InboxOutcome, start_next_message

E = AgentEventType


@pytest.fixture
def runner(sql_url: str) -> Iterator[AgentRunner]:
    agent = Agent(id="helper", chat_model=ScriptedChatModel(lambda request: AiMessage(content="noted")))
    turn_store = SqlAgentTurnStore(sql_url)
    yield AgentRunner(
        turn_store=turn_store,
        agent_loader=InMemoryAgentLoader([agent]),
        chat_memory_provider=SqlChatMemoryProvider(turn_store.engine),
    )
    turn_store.close()


@pytest.fixture
def inbox(runner: AgentRunner) -> Inbox:
    return Inbox(runner.turn_store.engine)  # type: ignore[attr-defined]


def conversation_events(runner: AgentRunner, conversation: str | ConversationKey) -> list[AgentEvent]:
    key = conversation if isinstance(conversation, ConversationKey) else ConversationKey(conversation)
    return runner.turn_store.read_events(EventScope.of_conversation(key))  # type: ignore[attr-defined,no-any-return]


def test_enqueue_writes_one_message_queued_event_at_the_next_conversation_position(
    runner: AgentRunner, inbox: Inbox
) -> None:
    # Given a busy conversation of one tenant (its TURN_STARTED is at position 1)
    acme, globex = ConversationKey("c-1", "acme"), ConversationKey("c-1", "globex")
    active = runner.start("helper", "working on it", conversation_id="c-1", tenant_id="acme")

    # When two messages are queued behind it, the first one twice
    first = inbox.enqueue("c-1", "m-1", "one more thing", agent_id="helper", tenant_id="acme")
    again = inbox.enqueue("c-1", "m-1", "one more thing", agent_id="helper", tenant_id="acme")
    second = inbox.enqueue("c-1", "m-2", "and this", tenant_id="acme")

    # Then each got one MESSAGE_QUEUED, in its conversation's order, naming the turn it starts as
    assert again.queued_event is None
    events = conversation_events(runner, acme)
    assert [(e.type, e.turn_id, e.cursor) for e in events] == [
        (E.TURN_STARTED, active.id, "1"),
        (E.MESSAGE_QUEUED, queued_turn_id("c-1", "m-1", "acme"), "2"),
        (E.MESSAGE_QUEUED, queued_turn_id("c-1", "m-2", "acme"), "3"),
    ]
    assert second.starts_as == events[2].turn_id != queued_turn_id("c-1", "m-2", "globex")
    assert events[1].conversation_id == "c-1" and events[1].tenant_id == "acme"
    assert events[1].data == {
        "message_id": "m-1",
        "sequence": 1,
        "ahead": 0,
        "content": "one more thing",
        "agent_id": "helper",
    }
    assert (events[2].data["sequence"], events[2].data["ahead"], events[2].data["agent_id"]) == (2, 1, None)
    assert first.queued_event is not None and first.queued_event.event_id == events[1].event_id
    assert first.starts_as == events[1].turn_id == events[1].root_turn_id
    # Only in that conversation's feed, not in another tenant's conversation of the same name,
    # nor in the feed of the turn tree it names (the tree's own events start at 1)
    assert conversation_events(runner, globex) == []
    assert runner.turn_store.read_events(EventScope.tree(first.starts_as)) == []  # type: ignore[attr-defined]


def test_a_message_whose_event_cannot_be_written_is_not_queued(runner: AgentRunner, inbox: Inbox) -> None:
    # Given an event row already filed where the message's event must go
    taken = queued_turn_id("c-1", "m-1")
    with runner.turn_store.engine.begin() as connection:  # type: ignore[attr-defined]
        connection.execute(
            sa.insert(turn_events).values(
                event_id="squatter",
                turn_id=taken,
                root_turn_id=taken,
                conversation_id=None,
                type=E.TURN_STARTED.value,
                created_at=utcnow(),
                payload={},
                root_position=0,
            )
        )

    # When the message is queued, the event's insert fails
    with pytest.raises(StoreError, match="root_position"):
        inbox.enqueue("c-1", "m-1", "hello")

    # Then nothing of it was stored: neither the message nor a conversation position
    assert inbox.get("m-1") is None and not inbox.has_waiting(ConversationKey("c-1"))
    assert conversation_events(runner, "c-1") == []
    queued = inbox.enqueue("c-1", "m-2", "hello")
    assert [e.cursor for e in conversation_events(runner, "c-1")] == ["1"]
    assert queued.sequence == 1  # the sequence taken by the failed enqueue was rolled back with it


def test_the_turn_of_a_queued_message_has_the_derived_id_and_links_back(runner: AgentRunner, inbox: Inbox) -> None:
    # Given a message queued behind a turn that then ends
    active = runner.start("helper", "working on it", conversation_id="c-1")
    inbox.enqueue("c-1", "m-1", "one more thing", agent_id="helper")
    runner.run_until_blocked(runner.turn_store.load(active.id))

    # When the next message is started
    assert start_next_message(runner, inbox, None, ConversationKey("c-1")) is InboxOutcome.STARTED

    # Then its turn has the id its MESSAGE_QUEUED named, and its TURN_STARTED names the message
    derived = queued_turn_id("c-1", "m-1")
    stored = inbox.get("m-1")
    assert stored is not None and (stored.status, stored.turn_id) == (InboxStatus.COMPLETED, derived)
    events = [e for e in conversation_events(runner, "c-1") if e.turn_id == derived]
    assert [e.type for e in events] == [E.MESSAGE_QUEUED, E.TURN_STARTED]
    assert events[1].data["queued_message_id"] == "m-1" and events[1].data["message_id"] == "m-1"
    # The turn tree's own feed starts with its TURN_STARTED
    tree = runner.turn_store.read_events(EventScope.tree(derived))  # type: ignore[attr-defined]
    assert [(e.type, e.cursor) for e in tree] == [(E.TURN_STARTED, "1")]


def test_a_message_started_again_does_not_start_a_second_turn(
    runner: AgentRunner, inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a message whose turn was started, then put back to PENDING (its claimer died before marking it)
    inbox.enqueue("c-1", "m-1", "hello", agent_id="helper")
    assert start_next_message(runner, inbox, None, ConversationKey("c-1")) is InboxOutcome.STARTED
    derived = queued_turn_id("c-1", "m-1")
    runner.run_until_blocked(runner.turn_store.load(derived))
    with runner.turn_store.engine.begin() as connection:  # type: ignore[attr-defined]
        connection.execute(sa.text("UPDATE agent_inbox_messages SET status = 'PENDING', turn_id = NULL"))
    # and a second starter that did not see the turn yet (it looked just before the first start)
    monkeypatch.setattr(inbox_module, "turn_started_from", lambda *args: None)

    # When the message is started again, the store refuses the second turn of that id
    with pytest.raises(VersionConflictError):
        runner.start("helper", "hello", conversation_id="c-1", turn_id=derived)
    assert start_next_message(runner, inbox, None, ConversationKey("c-1")) is InboxOutcome.ALREADY_STARTED

    # Then the message is completed with its one turn
    stored = inbox.get("m-1")
    assert stored is not None and (stored.status, stored.turn_id) == (InboxStatus.COMPLETED, derived)
    assert [t.id for t in runner.turn_store.list_turns(conversation_id="c-1")] == [derived]


def test_a_message_started_again_is_found_by_its_turn_id(runner: AgentRunner, inbox: Inbox) -> None:
    inbox.enqueue("c-1", "m-1", "hello", agent_id="helper")
    assert start_next_message(runner, inbox, None, ConversationKey("c-1")) is InboxOutcome.STARTED
    derived = queued_turn_id("c-1", "m-1")
    runner.run_until_blocked(runner.turn_store.load(derived))
    with runner.turn_store.engine.begin() as connection:  # type: ignore[attr-defined]
        connection.execute(sa.text("UPDATE agent_inbox_messages SET status = 'PENDING', turn_id = NULL"))
    assert inbox_module.turn_started_from(runner, ConversationKey("c-1"), "m-1") == derived
    assert start_next_message(runner, inbox, None, ConversationKey("c-1")) is InboxOutcome.ALREADY_STARTED
    assert [t.id for t in runner.turn_store.list_turns(conversation_id="c-1")] == [derived]


def test_a_failed_message_gets_one_message_failed_event(runner: AgentRunner, inbox: Inbox) -> None:
    inbox.enqueue("c-1", "m-1", "poison")
    assert inbox.mark_failed("m-1", "agent not found") is True
    assert inbox.mark_failed("m-1", "again") is False
    derived = queued_turn_id("c-1", "m-1")
    events = conversation_events(runner, "c-1")
    assert [(e.type, e.turn_id, e.cursor) for e in events] == [
        (E.MESSAGE_QUEUED, derived, "1"),
        (E.MESSAGE_FAILED, derived, "2"),
    ]
    assert events[1].data == {"message_id": "m-1", "error": "agent not found"}
    # Completing or releasing a message writes nothing
    inbox.enqueue("c-1", "m-2", "fine")
    assert inbox.claim_next(ConversationKey("c-1")) is not None and inbox.release_for_retry("m-2")
    assert inbox.claim_next(ConversationKey("c-1")) is not None and inbox.mark_completed("m-2", "t-2")
    assert len(conversation_events(runner, "c-1")) == 3
