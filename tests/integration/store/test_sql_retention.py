"""Retention on SQLite and PostgreSQL: what goes with pruned turns besides their messages and events."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from agent_runner import AgentEvent, AgentEventType, AgentTurn, AgentTurnStatus
from agent_runner.ids import utcnow
from agent_runner.persistence import EventScope
from store import Inbox, InboxStatus, SqlAgentTurnStore
from store.schema import inbox_messages, webhook_deliveries
from store.webhooks import DeliveryStatus, WebhookDeliveryLog, WebhookKind

MONTH = timedelta(days=30)


@pytest.fixture
def turns(sql_url: str) -> Iterator[SqlAgentTurnStore]:
    with SqlAgentTurnStore(sql_url) as store:
        yield store


def ended_turn(turns: SqlAgentTurnStore, turn_id: str, age: timedelta, status: AgentTurnStatus) -> str:
    """Save a turn last changed `age` ago with one event; return the event's id."""
    when = utcnow() - age
    turn = AgentTurn(id=turn_id, agent_id="a", status=status, created_at=when, updated_at=when)
    event = AgentEvent(event_id=f"{turn_id}:0:0", type=AgentEventType.TURN_COMPLETED, turn_id=turn_id)
    turns.save(turn, -1, [event])
    return event.event_id


def settle(inbox: Inbox, message_id: str, status: InboxStatus, turn_id: str | None, age: timedelta) -> None:
    """Queue a message and move it to `status`, last changed `age` ago."""
    inbox.enqueue("c-1", message_id, "hello")
    values = {"status": status.value, "turn_id": turn_id, "updated_at": utcnow() - age}
    with inbox.engine.begin() as connection:
        connection.execute(sa.update(inbox_messages).where(inbox_messages.c.message_id == message_id).values(values))


def delivery(log: WebhookDeliveryLog, event_id: str, status: DeliveryStatus, age: timedelta) -> None:
    when: datetime = utcnow() - age
    row = {
        "event_id": event_id,
        "kind": WebhookKind.ENDED.value,
        "url": "http://127.0.0.1:9/hook",
        "body": {"id": event_id},
        "status": status.value,
        "attempts": 1,
        "next_attempt_at": when,
        "event_created_at": when,
        "created_at": when,
        "updated_at": when,
    }
    with log.engine.begin() as connection:
        connection.execute(sa.insert(webhook_deliveries).values(row))


def test_inbox_messages_go_with_their_turns_and_failed_ones_with_age(turns: SqlAgentTurnStore) -> None:
    ended_turn(turns, "old", 2 * MONTH, AgentTurnStatus.COMPLETED)
    ended_turn(turns, "recent", timedelta(days=1), AgentTurnStatus.COMPLETED)
    with Inbox(turns.engine) as inbox:
        settle(inbox, "m-old-turn", InboxStatus.COMPLETED, "old", 2 * MONTH)
        settle(inbox, "m-recent-turn", InboxStatus.COMPLETED, "recent", 2 * MONTH)
        settle(inbox, "m-failed-old", InboxStatus.FAILED, None, 2 * MONTH)
        settle(inbox, "m-failed-recent", InboxStatus.FAILED, None, timedelta(days=1))
        settle(inbox, "m-pending-old", InboxStatus.PENDING, None, 2 * MONTH)
        settle(inbox, "m-claimed-old", InboxStatus.PROCESSING, None, 2 * MONTH)
        # Its turn still stands: the message stays however old it is.
        assert inbox.prune(MONTH) == 1
        assert inbox.get("m-failed-old") is None
        assert turns.prune(MONTH) == 1
        assert inbox.prune(MONTH, batch_size=1) == 1
        kept = {m for m in ("m-old-turn", "m-recent-turn", "m-failed-recent", "m-pending-old", "m-claimed-old")}
        assert {m for m in kept if inbox.get(m) is not None} == kept - {"m-old-turn"}
        # A pruned id is new to the queue again, after the earlier messages of its conversation.
        again = inbox.enqueue("c-1", "m-old-turn", "hello")
        assert again.status is InboxStatus.PENDING and again.sequence == 7


def test_a_failed_message_goes_with_its_message_events(turns: SqlAgentTurnStore) -> None:
    with Inbox(turns.engine) as inbox:
        inbox.enqueue("c-9", "m-failed", "hello")
        inbox.enqueue("c-9", "m-waiting", "still queued")
        assert inbox.mark_failed("m-failed", "no such agent")
        with inbox.engine.begin() as connection:
            stale = sa.update(inbox_messages).where(inbox_messages.c.message_id == "m-failed")
            connection.execute(stale.values(updated_at=utcnow() - 2 * MONTH))
        before = turns.read_events(EventScope.conversation("c-9"))
        assert [e.type for e in before] == [
            AgentEventType.MESSAGE_QUEUED,
            AgentEventType.MESSAGE_QUEUED,
            AgentEventType.MESSAGE_FAILED,
        ]
        assert inbox.prune(MONTH, batch_size=1) == 1
        assert inbox.get("m-failed") is None
        # The waiting message and its event stay
        left = turns.read_events(EventScope.conversation("c-9"))
        assert [(e.type, e.data["message_id"]) for e in left] == [(AgentEventType.MESSAGE_QUEUED, "m-waiting")]


def test_settled_deliveries_go_once_their_event_is_pruned(turns: SqlAgentTurnStore) -> None:
    old_event = ended_turn(turns, "old", 2 * MONTH, AgentTurnStatus.COMPLETED)
    old_failed = ended_turn(turns, "old-failed", 2 * MONTH, AgentTurnStatus.FAILED)
    recent_event = ended_turn(turns, "recent", timedelta(days=1), AgentTurnStatus.COMPLETED)
    with WebhookDeliveryLog(turns.engine) as log:
        delivery(log, old_event, DeliveryStatus.DELIVERED, 2 * MONTH)
        delivery(log, old_failed, DeliveryStatus.DEAD, 2 * MONTH)
        delivery(log, recent_event, DeliveryStatus.DELIVERED, 2 * MONTH)
        delivery(log, "gone-long-ago:0:0", DeliveryStatus.PENDING, 2 * MONTH)
        # Every event is still in the log: discovery would owe them again, so nothing goes.
        assert log.prune(MONTH) == 0
        assert turns.prune(MONTH) == 2
        assert log.prune(MONTH, batch_size=1) == 2
        assert {d.event_id for d in log.list_deliveries()} == {recent_event, "gone-long-ago:0:0"}


@pytest.mark.parametrize(("older_than", "batch_size"), [(timedelta(days=-1), 10), (MONTH, 0)])
def test_bad_retention_arguments_are_refused(sql_url: str, older_than: timedelta, batch_size: int) -> None:
    with Inbox(sql_url) as inbox, WebhookDeliveryLog(sql_url) as log:
        with pytest.raises(ValueError):
            inbox.prune(older_than, batch_size=batch_size)
        with pytest.raises(ValueError):
            log.prune(older_than, batch_size=batch_size)
