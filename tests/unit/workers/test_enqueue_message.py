"""`workers.inbox`: queue a message for a conversation that may be busy; settle claims of dead claimers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    DefinitionError,
    InMemoryAgentLoader,
    InMemoryLiveEvents,
    InputLimitError,
    InvalidTextError,
    ScriptedChatModel,
    UserMessage,
)
from agent_runner.persistence import ConversationKey, EventScope
from store import Inbox, InboxStatus, SqlAgentTurnStore, SqlChatMemoryProvider
from workers.inbox import enqueue_message, settle_stale_claims, start_next_message
from workers.live import announce, attach_live


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[AgentRunner]:
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    agent = Agent(id="helper", chat_model=ScriptedChatModel(lambda request: AiMessage(content="noted")))
    turn_store = SqlAgentTurnStore(url)
    yield AgentRunner(
        turn_store=turn_store,
        agent_loader=InMemoryAgentLoader([agent]),
        chat_memory_provider=SqlChatMemoryProvider(url),
    )
    turn_store.close()


def test_a_message_for_a_free_conversation_starts_its_turn_at_once(runner: AgentRunner) -> None:
    message = enqueue_message(runner, "c1", "first question", message_id="m-1", agent_id="helper")

    turn = runner.turn_store.find_active_turn("c1")
    assert turn is not None and turn.status is AgentTurnStatus.READY
    assert turn.messages[-1].id == "m-1" and turn.messages[-1].content == "first question"
    inbox = Inbox(runner.turn_store.engine)  # type: ignore[attr-defined]
    stored = inbox.get(message.message_id)
    assert stored is not None and stored.status is InboxStatus.COMPLETED and stored.turn_id == turn.id


def test_a_message_for_a_busy_conversation_waits_for_the_turn_to_end(runner: AgentRunner) -> None:
    active = runner.start("helper", "working on it", conversation_id="c2")

    queued = enqueue_message(runner, "c2", "one more thing", message_id="m-2", agent_id="helper")
    again = enqueue_message(runner, "c2", "one more thing", message_id="m-2", agent_id="helper")

    assert queued.status is InboxStatus.PENDING and again.sequence == queued.sequence
    assert runner.turn_store.find_active_turn("c2") == runner.turn_store.load(active.id)
    # Once the active turn ends, the next message starts
    runner.run_until_blocked(runner.turn_store.load(active.id))
    inbox = Inbox(runner.turn_store.engine)  # type: ignore[attr-defined]
    start_next_message(runner, inbox, None, ConversationKey("c2"))
    following = runner.turn_store.find_active_turn("c2")
    assert following is not None and following.messages[-1].id == "m-2"


def test_a_queued_message_is_announced_where_the_runners_events_go_live(runner: AgentRunner) -> None:
    # Given a runner whose events go to a live channel, and a busy conversation
    live = InMemoryLiveEvents()
    attach_live(runner, live.publish)
    runner.start("helper", "working on it", conversation_id="c-live")

    # When a message is queued behind its active turn, then queued again (a retry)
    queued = enqueue_message(runner, "c-live", "one more thing", message_id="m-live", agent_id="helper")
    enqueue_message(runner, "c-live", "one more thing", message_id="m-live", agent_id="helper")

    # Then the conversation's followers get MESSAGE_QUEUED live, once, as the log stores it
    announced = [e for e in live.read(EventScope.conversation("c-live")) if e.type is AgentEventType.MESSAGE_QUEUED]
    assert [e.event_id for e in announced] == [queued.queued_event.event_id]  # type: ignore[union-attr]
    assert announced[0].data["message_id"] == "m-live"


def test_a_runner_without_a_live_channel_announces_nothing(runner: AgentRunner) -> None:
    runner.start("helper", "working on it", conversation_id="c-quiet")

    queued = enqueue_message(runner, "c-quiet", "later", message_id="m-quiet", agent_id="helper")

    assert queued.queued_event is not None
    assert announce(runner, queued.queued_event) is False


DEEP: list[Any] = []
for _ in range(100):
    DEEP = [DEEP]


@pytest.mark.parametrize(
    ("content", "extra", "error"),
    [
        ("x" * (1024 * 1024 + 1), {}, InputLimitError),
        ("bad \udc80 text", {}, InvalidTextError),
        ("fine", {"message_id": "m" * 500}, InputLimitError),
        ("fine", {"metadata": {"deep": DEEP}}, InputLimitError),
    ],
    ids=["content-too-big", "lone-surrogate", "message-id-too-long", "metadata-too-deep"],
)
def test_a_message_a_turn_could_never_take_is_refused_before_it_is_queued(
    runner: AgentRunner, content: str, extra: dict[str, Any], error: type[Exception]
) -> None:
    inbox = Inbox(runner.turn_store.engine)  # type: ignore[attr-defined]
    with pytest.raises(error):
        enqueue_message(runner, "c-bad", content, agent_id="helper", inbox=inbox, **extra)
    assert inbox.claim_next(ConversationKey("c-bad")) is None and runner.turn_store.find_active_turn("c-bad") is None


def test_a_runner_without_a_sql_store_needs_an_inbox() -> None:
    with pytest.raises(DefinitionError, match="inbox="):
        enqueue_message(AgentRunner(), "c3", "hello", agent_id="helper")


def test_stale_claims_are_completed_when_their_turn_started_and_queued_again_otherwise(runner: AgentRunner) -> None:
    # Given two claimed messages whose claimers died: one after starting its turn, one before
    inbox = Inbox(runner.turn_store.engine)  # type: ignore[attr-defined]
    for conversation, message in (("c-started", "m-started"), ("c-lost", "m-lost")):
        inbox.enqueue(conversation, message, "hello", agent_id="helper")
        assert inbox.claim_next(ConversationKey(conversation)) is not None
    started = runner.start("helper", UserMessage(id="m-started", content="hello"), conversation_id="c-started")

    # When the claims are settled while they are young, nothing changes
    now = runner.clock()
    assert settle_stale_claims(runner, inbox, now - timedelta(minutes=1)) == 0
    assert inbox.get("m-lost").status is InboxStatus.PROCESSING  # type: ignore[union-attr]

    # Once they are old enough, the started one is completed with its turn and the other queued again
    assert settle_stale_claims(runner, inbox, now + timedelta(minutes=1)) == 2
    completed, requeued = inbox.get("m-started"), inbox.get("m-lost")
    assert completed is not None and (completed.status, completed.turn_id) == (InboxStatus.COMPLETED, started.id)
    assert requeued is not None and requeued.status is InboxStatus.PENDING


def test_the_turn_a_queued_message_starts_names_the_message_in_its_turn_started_event(runner: AgentRunner) -> None:
    events: list[AgentEvent] = []
    runner.add_event_listener(events.append)
    active = runner.start("helper", "working on it", conversation_id="c3")
    enqueue_message(runner, "c3", "and then this", message_id="m-3", agent_id="helper")
    runner.run_until_blocked(runner.turn_store.load(active.id))
    start_next_message(runner, Inbox(runner.turn_store.engine), None, ConversationKey("c3"))  # type: ignore[attr-defined]
    started = [e for e in events if e.type is AgentEventType.TURN_STARTED]
    assert [e.data["message_id"] for e in started][-1] == "m-3"
    assert started[-1].turn_id != active.id and started[-1].conversation_id == "c3"


@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "one-turn-each"])
def test_messages_queued_together_start_one_turn_when_the_inbox_coalesces(runner: AgentRunner, coalesce: bool) -> None:
    engine = runner.turn_store.engine  # type: ignore[attr-defined]
    inbox = Inbox(engine, coalesce=coalesce)
    active = runner.start("helper", "working on it", conversation_id="c-co")
    for i in range(3):
        enqueue_message(runner, "c-co", f"note {i}", message_id=f"m-co-{i}", agent_id="helper", inbox=inbox)
    enqueue_message(runner, "c-co", "for another agent", message_id="m-other", agent_id="other", inbox=inbox)
    runner.run_until_blocked(runner.turn_store.load(active.id))

    start_next_message(runner, inbox, None, ConversationKey("c-co"))

    first = runner.turn_store.find_active_turn("c-co")
    assert first is not None and first.messages[-1].id == "m-co-0"
    records = [inbox.get(f"m-co-{i}") for i in range(3)]
    if not coalesce:
        assert [r.status for r in records if r is not None] == [InboxStatus.COMPLETED, *[InboxStatus.PENDING] * 2]
        return
    # The three start one turn: the first as its message, the others joining it in order
    assert all(r is not None and (r.status, r.turn_id) == (InboxStatus.COMPLETED, first.id) for r in records)
    ended = runner.run_until_blocked(first)
    users = [m.content for m in ended.messages if isinstance(m, UserMessage)]
    assert users[-3:] == ["note 0", "note 1", "note 2"] and ended.steered_message_ids == ["m-co-1", "m-co-2"]
    # A message for another agent waits for a turn of its own
    other = inbox.get("m-other")
    assert other is not None and other.status is InboxStatus.PENDING
