"""`Inbox`: user messages queued per conversation until the conversation is free for a new turn.

A message arrives while its conversation still has an active turn; it waits here as
PENDING. When the conversation is free, a sweep claims the next message (PROCESSING),
starts a turn with it and marks it COMPLETED, or puts it back for a retry. Queued messages
are not written to ChatMemory: the turn started from them projects them when it begins.

Queueing a message writes its MESSAGE_QUEUED event to the event log in the same
transaction, and giving up on it (`mark_failed`) writes MESSAGE_FAILED, so a follower of the
conversation sees every queued message, and never one that was not stored. Both name the
turn the message starts as (`agent_runner.ids.queued_turn_id`); see `store._event_log`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from agent_runner.event_payloads import message_failed, message_queued
from agent_runner.events import MESSAGE_EVENT_TYPES, AgentEvent, AgentEventType
from agent_runner.ids import queued_turn_id, utcnow
from agent_runner.persistence import ConversationKey
from store._backend import SqlBackend, retention_cutoff
from store._engine import AnyRow, UrlOrEngine, dialect_insert, translated_errors
from store._event_log import MESSAGE_FAILED_POSITION, MESSAGE_QUEUED_POSITION, SqlEventLog
from store.schema import (
    NON_TERMINAL_STATUSES,
    inbox_conversations,
    inbox_messages,
    tenant_key,
    tenant_of,
    turn_events,
    turns,
)


class InboxStatus(StrEnum):
    """Where a queued message is in its life. Values are stored: add, never rename."""

    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class InboxMessage:
    """A queued user message.

    Attributes:
        message_id: Caller-chosen id; enqueueing the same id again changes nothing.
        conversation_id: The conversation the message belongs to.
        content: The message text.
        sequence: Position in the conversation's queue (1, 2, ...; gaps are possible).
        status: PENDING, PROCESSING, COMPLETED or FAILED.
        turn_id: The turn started from the message, once COMPLETED.
        error: Why the message FAILED.
        agent_id: The agent that answers it (None: the deployment's inbox agent).
        tenant_id: The tenant the turn started from it belongs to.
        metadata: The metadata of that turn.
        queued_event: The MESSAGE_QUEUED event `Inbox.enqueue` wrote with the message; None
            on a record read back (or returned by an enqueue that found the message stored).
    """

    message_id: str
    conversation_id: str
    content: str
    sequence: int
    status: InboxStatus
    turn_id: str | None = None
    error: str | None = None
    agent_id: str | None = None
    tenant_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    queued_event: AgentEvent | None = field(default=None, compare=False)

    @property
    def conversation(self) -> ConversationKey:
        """The conversation the message belongs to: its id and its tenant."""
        return ConversationKey(self.conversation_id, self.tenant_id)

    @property
    def starts_as(self) -> str:
        """The id of the turn started from the message (named by its events before that turn exists)."""
        return queued_turn_id(self.conversation_id, self.message_id, self.tenant_id)


_COLUMNS = (
    inbox_messages.c.message_id,
    inbox_messages.c.conversation_id,
    inbox_messages.c.content,
    inbox_messages.c.sequence,
    inbox_messages.c.status,
    inbox_messages.c.turn_id,
    inbox_messages.c.error,
    inbox_messages.c.agent_id,
    inbox_messages.c.tenant_id,
    inbox_messages.c.turn_metadata,
)


def _record(row: AnyRow) -> InboxMessage:
    return InboxMessage(
        message_id=row.message_id,
        conversation_id=row.conversation_id,
        content=row.content,
        sequence=row.sequence,
        status=InboxStatus(row.status),
        turn_id=row.turn_id,
        error=row.error,
        agent_id=row.agent_id,
        tenant_id=tenant_of(row.tenant_id),
        metadata=dict(row.turn_metadata or {}),
    )


def _message_event(message: InboxMessage, kind: AgentEventType, data: dict[str, Any]) -> AgentEvent:
    """An event of a queued message, filed under the turn it starts as; its id follows from the two."""
    turn_id = message.starts_as
    event_id = hashlib.sha256(f"{kind.value}\x00{turn_id}".encode()).hexdigest()[:32]
    return AgentEvent(
        event_id=event_id,
        type=kind,
        turn_id=turn_id,
        root_turn_id=turn_id,
        conversation_id=message.conversation_id,
        tenant_id=message.tenant_id,
        data=data,
    )


class Inbox(SqlBackend):
    """Per-conversation queues of user messages in PostgreSQL or SQLite.

    `claim_next` is atomic across processes and keeps each conversation's order: a
    conversation never has two messages PROCESSING, and a message is claimed only after
    every earlier one is COMPLETED or FAILED.

    Args:
        url_or_engine: A database URL or an engine to share. An engine made from a URL is
            disposed of by `close()`; one passed in is left open.
        coalesce: Whether a turn started from this inbox takes all the conversation's
            waiting messages, the first as its message and the others as steering messages
            (`workers.inbox.start_next_message`); off (the default), one turn per message.
    """

    def __init__(self, url_or_engine: UrlOrEngine, *, coalesce: bool = False) -> None:
        super().__init__(url_or_engine)
        self._events = SqlEventLog(self._engine)
        self.coalesce = coalesce

    def enqueue(
        self,
        conversation_id: str,
        message_id: str,
        content: str,
        *,
        agent_id: str | None = None,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> InboxMessage:
        """Queue a message at the end of its conversation; return the stored record.

        Idempotent on `message_id`: enqueueing an id again returns the record already
        stored (whatever its conversation, content or status) and changes nothing.

        The message's MESSAGE_QUEUED event is written in the same transaction, at the next
        position of the conversation's event log (returned as `queued_event`; announcing
        it on a live channel is the caller's part).

        Args:
            conversation_id: The conversation whose queue the message joins.
            message_id: The message's id; the turn started from it uses it for its user message.
            content: The message text.
            agent_id: The agent to answer it (default: the deployment's inbox agent).
            tenant_id: The tenant of the turn started from it.
            metadata: JSON metadata of the turn started from it.
        """
        now = utcnow()
        with translated_errors(self._engine, f"enqueueing message {message_id!r}"):
            with self._writer.begin() as connection:
                existing = self._get(connection, message_id)
                if existing is not None:
                    return existing
                # The counter row hands out sequence numbers; its row lock orders concurrent
                # enqueuers of one conversation. It is also the row claimers lock.
                counter = dialect_insert(connection, inbox_conversations).values(
                    tenant_id=tenant_key(tenant_id), conversation_id=conversation_id, last_sequence=1
                )
                counter = counter.on_conflict_do_update(
                    index_elements=[inbox_conversations.c.tenant_id, inbox_conversations.c.conversation_id],
                    set_={"last_sequence": inbox_conversations.c.last_sequence + 1},
                )
                sequence = connection.execute(counter.returning(inbox_conversations.c.last_sequence)).scalar_one()
                insert = (
                    dialect_insert(connection, inbox_messages)
                    .values(
                        message_id=message_id,
                        conversation_id=conversation_id,
                        sequence=sequence,
                        content=content,
                        status=InboxStatus.PENDING.value,
                        attempts=0,
                        created_at=now,
                        updated_at=now,
                        agent_id=agent_id,
                        tenant_id=tenant_key(tenant_id),
                        turn_metadata=dict(metadata) if metadata else None,
                    )
                    .on_conflict_do_nothing(index_elements=[inbox_messages.c.message_id])
                    .returning(*_COLUMNS)
                )
                row = connection.execute(insert).first()
                if row is not None:
                    return self._write_queued(connection, _record(row))
                # A concurrent enqueue of the same id committed first.
                raced = self._get(connection, message_id)
                assert raced is not None
                return raced

    def _write_queued(self, connection: Connection, message: InboxMessage) -> InboxMessage:
        # The counter row lock held since the sequence was taken keeps `ahead` exact, and
        # it is taken before the event log's conversation counter, as by every enqueuer.
        ahead = connection.execute(
            sa.select(sa.func.count()).where(
                *_names(inbox_messages, message.conversation),
                inbox_messages.c.status.in_([InboxStatus.PENDING.value, InboxStatus.PROCESSING.value]),
                inbox_messages.c.sequence < message.sequence,
            )
        ).scalar_one()
        data = message_queued(message.message_id, message.sequence, ahead, message.content, message.agent_id)
        event = _message_event(message, AgentEventType.MESSAGE_QUEUED, data)
        self._events.write_message_event(connection, event, MESSAGE_QUEUED_POSITION)
        return replace(message, queued_event=event)

    def get(self, message_id: str) -> InboxMessage | None:
        """Return the stored record of a message, or None."""
        with translated_errors(self._engine, f"reading message {message_id!r}"), self._engine.connect() as connection:
            return self._get(connection, message_id)

    @staticmethod
    def _get(connection: Connection, message_id: str) -> InboxMessage | None:
        row = connection.execute(sa.select(*_COLUMNS).where(inbox_messages.c.message_id == message_id)).first()
        return None if row is None else _record(row)

    def claim_next(self, conversation: ConversationKey) -> InboxMessage | None:
        """Move the conversation's oldest PENDING message to PROCESSING and return it.

        Returns None when the conversation has no PENDING message, already has one
        PROCESSING, or another process is claiming for it at this very moment.
        """
        with translated_errors(self._engine, f"claiming from conversation {conversation}"):
            with self._writer.begin() as connection:
                if connection.dialect.name == "postgresql":
                    return self._claim_locked(connection, conversation)
                return self._claim_guarded(connection, conversation)

    def _claim_locked(self, connection: Connection, conversation: ConversationKey) -> InboxMessage | None:
        # Claimers of one conversation serialize on its counter row. SKIP LOCKED makes a
        # second claimer give up at once instead of queueing behind the first: the first
        # will hand out the next message, and the second has other conversations to serve.
        # Locking message rows instead would let the second claimer skip the locked first
        # message and take the one after it, breaking the order.
        locked = connection.execute(
            sa.select(inbox_conversations.c.conversation_id)
            .where(*_names(inbox_conversations, conversation))
            .with_for_update(skip_locked=True)
        ).first()
        if locked is None:
            return None
        # Under READ COMMITTED this statement sees every claim committed before the lock
        # was granted, so a message PROCESSING elsewhere is visible here.
        processing = (
            sa.select(sa.literal(1))
            .where(*_names(inbox_messages, conversation), inbox_messages.c.status == InboxStatus.PROCESSING.value)
            .exists()
        )
        candidate = connection.execute(
            sa.select(*_COLUMNS, processing.label("busy"))
            .where(*_names(inbox_messages, conversation), inbox_messages.c.status == InboxStatus.PENDING.value)
            .order_by(inbox_messages.c.sequence)
            .limit(1)
        ).first()
        if candidate is None or candidate.busy:
            return None
        connection.execute(
            sa.update(inbox_messages)
            .where(inbox_messages.c.message_id == candidate.message_id)
            .values(status=InboxStatus.PROCESSING.value, attempts=inbox_messages.c.attempts + 1, updated_at=utcnow())
        )
        return replace(_record(candidate), status=InboxStatus.PROCESSING)

    def _claim_guarded(self, connection: Connection, conversation: ConversationKey) -> InboxMessage | None:
        # SQLite runs one writer at a time (this transaction began IMMEDIATE), so a single
        # UPDATE whose WHERE re-checks the conditions is atomic.
        earlier = inbox_messages.alias("earlier")
        other = inbox_messages.alias("other")
        oldest_pending = (
            sa.select(earlier.c.message_id)
            .where(*_names(earlier, conversation), earlier.c.status == InboxStatus.PENDING.value)
            .order_by(earlier.c.sequence)
            .limit(1)
            .scalar_subquery()
        )
        processing = (
            sa.select(sa.literal(1))
            .where(*_names(other, conversation), other.c.status == InboxStatus.PROCESSING.value)
            .exists()
        )
        row = connection.execute(
            sa.update(inbox_messages)
            .where(
                inbox_messages.c.message_id == oldest_pending,
                inbox_messages.c.status == InboxStatus.PENDING.value,
                ~processing,
            )
            .values(status=InboxStatus.PROCESSING.value, attempts=inbox_messages.c.attempts + 1, updated_at=utcnow())
            .returning(*_COLUMNS)
        ).first()
        return None if row is None else _record(row)

    def mark_completed(self, message_id: str, turn_id: str) -> bool:
        """Record that the PROCESSING message started `turn_id`; False when it was not PROCESSING."""
        return self._move(message_id, (InboxStatus.PROCESSING,), InboxStatus.COMPLETED, turn_id=turn_id)

    def release_for_retry(self, message_id: str) -> bool:
        """Put a PROCESSING message back to PENDING at its place in the queue; False when it was not PROCESSING."""
        return self._move(message_id, (InboxStatus.PROCESSING,), InboxStatus.PENDING)

    def mark_failed(self, message_id: str, error: str) -> bool:
        """Give up on a PENDING or PROCESSING message; False when it had already ended.

        The conversation's later messages can then be claimed. Its MESSAGE_FAILED event is
        written in the same transaction.
        """
        return self._move(message_id, (InboxStatus.PENDING, InboxStatus.PROCESSING), InboxStatus.FAILED, error=error)

    def _move(
        self,
        message_id: str,
        sources: tuple[InboxStatus, ...],
        target: InboxStatus,
        *,
        turn_id: str | None = None,
        error: str | None = None,
    ) -> bool:
        values: dict[str, Any] = {"status": target.value, "updated_at": utcnow()}
        if turn_id is not None:
            values["turn_id"] = turn_id
        if error is not None:
            values["error"] = error
        statement = (
            sa.update(inbox_messages)
            .where(inbox_messages.c.message_id == message_id, inbox_messages.c.status.in_([s.value for s in sources]))
            .values(values)
            .returning(*_COLUMNS)
        )
        with translated_errors(self._engine, f"marking message {message_id!r} {target.value}"):
            with self._writer.begin() as connection:
                row = connection.execute(statement).first()
                if row is not None and target is InboxStatus.FAILED:
                    message = _record(row)
                    event = _message_event(
                        message, AgentEventType.MESSAGE_FAILED, message_failed(message_id, error or "")
                    )
                    self._events.write_message_event(connection, event, MESSAGE_FAILED_POSITION)
                return row is not None

    def has_waiting(self, conversation: ConversationKey) -> bool:
        """Whether the conversation has a message that has not started its turn yet (PENDING or PROCESSING).

        A new message of such a conversation must queue behind it, even while the
        conversation has no active turn (between a turn's end and the start of the next
        queued message), or it would start first.
        """
        query = sa.select(
            sa.select(sa.literal(1))
            .where(
                *_names(inbox_messages, conversation),
                inbox_messages.c.status.in_([InboxStatus.PENDING.value, InboxStatus.PROCESSING.value]),
            )
            .exists()
        )
        with translated_errors(self._engine, f"reading the queue of {conversation}"), self._engine.connect() as c:
            return bool(c.execute(query).scalar_one())

    def stale_claims(self, claimed_before: datetime, limit: int = 100) -> list[InboxMessage]:
        """Return PROCESSING messages claimed before `claimed_before`, oldest first.

        A claim that old most likely belongs to a dispatcher that died between `claim_next`
        and `mark_completed`; a sweep settles it.
        """
        if limit <= 0:
            return []
        query = (
            sa.select(*_COLUMNS)
            .where(
                inbox_messages.c.status == InboxStatus.PROCESSING.value, inbox_messages.c.updated_at < claimed_before
            )
            .order_by(inbox_messages.c.updated_at, inbox_messages.c.message_id)
            .limit(limit)
        )
        with translated_errors(self._engine, "listing stale inbox claims"), self._engine.connect() as connection:
            return [_record(row) for row in connection.execute(query)]

    def conversations_ready(self, limit: int = 100) -> list[ConversationKey]:
        """Return conversations that can start a turn from their inbox, oldest waiting message first.

        A conversation is ready when it has a PENDING message, none PROCESSING, and no
        non-terminal turn in the turn store.
        """
        if limit <= 0:
            return []
        processing = inbox_messages.alias("processing")
        pending = inbox_messages.alias("pending")
        query = (
            sa.select(pending.c.tenant_id, pending.c.conversation_id)
            .where(
                pending.c.status == InboxStatus.PENDING.value,
                ~sa.select(sa.literal(1))
                .where(
                    processing.c.tenant_id == pending.c.tenant_id,
                    processing.c.conversation_id == pending.c.conversation_id,
                    processing.c.status == InboxStatus.PROCESSING.value,
                )
                .exists(),
                ~sa.select(sa.literal(1))
                .where(
                    turns.c.tenant_id == pending.c.tenant_id,
                    turns.c.conversation_id == pending.c.conversation_id,
                    turns.c.status.in_(NON_TERMINAL_STATUSES),
                )
                .exists(),
            )
            .group_by(pending.c.tenant_id, pending.c.conversation_id)
            .order_by(sa.func.min(pending.c.created_at), pending.c.conversation_id, pending.c.tenant_id)
            .limit(limit)
        )
        with translated_errors(self._engine, "listing ready conversations"), self._engine.connect() as connection:
            return [ConversationKey(row.conversation_id, tenant_of(row.tenant_id)) for row in connection.execute(query)]

    def prune(self, older_than: timedelta, *, batch_size: int = 500) -> int:
        """Delete the settled messages last changed more than `older_than` ago; return how many.

        A COMPLETED message goes once its turn is gone (pruned with its tree, see
        `SqlAgentTurnStore.prune`), a FAILED one once it is that old, with its message events
        (MESSAGE_QUEUED, MESSAGE_FAILED); PENDING and PROCESSING messages always stay. A
        message id that was pruned is new again to `enqueue`. The conversation's sequence
        counter stays, so later messages still queue after the earlier ones.

        Raises:
            ValueError: `older_than` is negative or `batch_size` is below 1.
            StoreUnavailableError: The database failed; the batches already committed stay deleted.
        """
        cutoff = retention_cutoff(older_than, batch_size)
        message = inbox_messages.c
        turn_gone = ~sa.select(sa.literal(1)).where(turns.c.id == message.turn_id).exists()
        completed = sa.and_(message.updated_at < cutoff, message.status == InboxStatus.COMPLETED.value, turn_gone)
        removed = self._delete_in_batches(message.message_id, completed, batch_size, "pruning inbox messages")
        return removed + self._prune_failed(cutoff, batch_size)

    def _prune_failed(self, cutoff: datetime, batch_size: int) -> int:
        """Delete FAILED messages changed before `cutoff` with their message events, in batches; return how many.

        Their events are filed under a turn that never existed, so no turn prune reaches them.
        """
        message = inbox_messages.c
        query = (
            sa.select(message.message_id, message.conversation_id, message.tenant_id)
            .where(message.status == InboxStatus.FAILED.value, message.updated_at < cutoff)
            .limit(batch_size)
        )
        message_events = [t.value for t in MESSAGE_EVENT_TYPES]
        removed = 0
        while True:
            with translated_errors(self._engine, "pruning failed inbox messages"), self._writer.begin() as connection:
                rows = connection.execute(query).all()
                if rows:
                    trees = [
                        queued_turn_id(row.conversation_id, row.message_id, tenant_of(row.tenant_id)) for row in rows
                    ]
                    connection.execute(
                        sa.delete(turn_events).where(
                            turn_events.c.root_turn_id.in_(trees), turn_events.c.type.in_(message_events)
                        )
                    )
                    ids = [row.message_id for row in rows]
                    connection.execute(sa.delete(inbox_messages).where(message.message_id.in_(ids)))
            removed += len(rows)
            if len(rows) < batch_size:
                return removed


def _names(table: sa.FromClause, conversation: ConversationKey) -> tuple[sa.ColumnElement[bool], ...]:
    """The conditions that select the rows of `table` (an inbox table or an alias of one) of a conversation."""
    return (
        table.c.tenant_id == tenant_key(conversation.tenant_id),
        table.c.conversation_id == conversation.conversation_id,
    )
