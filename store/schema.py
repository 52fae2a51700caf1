"""The SQL tables of the durable backends (SQLAlchemy Core), shared by PostgreSQL and SQLite.

The Alembic migrations in `store.migrations` create exactly this schema; a test compares
the migrated database with `metadata`, so a change here needs a new migration.

Conversations: a conversation is named by its tenant and its own id together (two tenants
may use the same id), so every table that keys by conversation keys by `(tenant_id,
conversation_id)`, and every lookup by conversation names both. Conversation ids are stored
as the tenant named them. Without a tenant, `tenant_id` is `NO_TENANT` (`""`): key columns
cannot be NULL, and a NULL would not be equal to itself in a unique index.

Tables:
    agent_turns: one header row per turn. `version` is the compare-and-swap counter;
        `message_count` says how many rows of `agent_turn_messages` belong to the stored
        snapshot; `state` holds the rest of the snapshot (suspension, pending calls,
        children, usage, ...) as JSON. A turn's row is rewritten at every step, so no
        index covers a column that changes at every step (`updated_at`, `version`,
        `state`, ...): PostgreSQL can then write the new row version on the same page
        without touching any index (a HOT update), and pages are left a quarter free
        (`fillfactor`) to make room for it. Sweeps that look for turns idle since a
        time use `status_changed_at` instead, which changes only with the status.
        `wake_at` is when the deadline sweep must look at a waiting turn next.
        `event_position` is, on a root turn's row, the last position handed out in its
        turn tree's event log (0 on child turns; see `store._event_log`).
    agent_turn_messages: the turn's messages, append-only, keyed by (turn_id, seq).
    agent_turn_events: the durable events, append-only, written with the save that caused
        them. `root_position` is the event's place in its turn tree and
        `conversation_position` its place in its conversation (NULL without one): each scope
        counts its events 1, 2, 3, ... in the order their saves committed, and readers page
        by these (see `store._event_log`). `xid` is only kept for events written before
        positions existed (NULL since), to resume the cursors issued then.
    agent_event_conversations: the last position handed out in each conversation's event
        log. A save bumps this row, and its tree's root row (`event_position`), in the
        statement that writes its events; their row locks put the saves of one tree or
        conversation in commit order.
    agent_chat_conversations / agent_chat_messages: ChatMemory, with a per-conversation
        sequence counter.
    agent_inbox_conversations / agent_inbox_messages: the inbox of queued user messages.
    agent_turn_leases: the SQL turn lease (owner, fence, expiry).
    agent_idempotency_keys: the first answer to each HTTP request sent with an
        `Idempotency-Key`, per tenant and key, so that a retried request is answered the
        same and acts once.
    agent_threads: what a conversation has beyond its messages and turns when a client
        manages it as a thread (the LangGraph API): who owns it, its metadata, when it
        was created, and whether it was deleted.
    agent_crons: schedules made over HTTP (LangGraph crons): the `workers.schedules`
        definition of each, with its owner, thread and the request that made it.
    agent_webhook_deliveries: one row per event owed to a webhook, keyed by the event id:
        its attempts, the next one, and the outcome (DEAD rows are the dead letters; see
        `store.webhooks`).
    agent_turn_steering: the steering messages of turns (`AgentRunner.steer`), one row each,
        unique per turn and message id, ordered by `sequence`. Whether one was applied is in the
        turn's snapshot; `forwarded` marks those an ended turn handed on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from agent_runner.snapshot import AgentTurnStatus

NON_TERMINAL_STATUSES: tuple[str, ...] = tuple(s.value for s in AgentTurnStatus if not s.is_terminal)
"""Statuses of a turn that still holds its conversation."""

ACTIVE_TURN_PREDICATE = "status IN ({})".format(", ".join(f"'{s}'" for s in NON_TERMINAL_STATUSES))
"""Predicate of the partial unique index on active conversation turns.

Migration 0001 spells out the same list: a new non-terminal status needs a migration that
recreates the index.
"""

HAS_CONVERSATION = "conversation_id IS NOT NULL"
"""Predicate of the partial index of events by conversation."""

NO_TENANT = ""
"""The `tenant_id` column value of no tenant (never a tenant name): stores map it to and from None."""


def tenant_key(tenant_id: str | None) -> str:
    """The `tenant_id` column value of the tenant `tenant_id` (None: no tenant)."""
    return NO_TENANT if tenant_id is None else tenant_id


def tenant_of(key: str | None) -> str | None:
    """The tenant a `tenant_id` column value stands for (None: no tenant)."""
    return None if key is None or key == NO_TENANT else key


TURNS_FILLFACTOR = 75
"""Percent of each `agent_turns` page filled by inserts on PostgreSQL; the rest takes the new
row versions of HOT updates (migration 0005 sets it)."""

VERSION_TABLE = "agent_runner_alembic_version"
"""Alembic's revision table for these tables, named so it cannot clash with an application's own."""


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on both databases.

    PostgreSQL stores `timestamptz`; SQLite has no timezone support and stores the UTC
    wall time as text, which sorts and compares correctly because every value is UTC.
    Naive values are taken to be UTC.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC before storing."""
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Return an aware UTC datetime."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _json() -> sa.types.TypeEngine[Any]:
    # Plain `json`, not `jsonb`, on PostgreSQL: it keeps the text as written, so key order
    # (the field order of a form's JSON Schema, say) survives the round trip.
    return sa.JSON(none_as_null=True)


metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

turns = sa.Table(
    "agent_turns",
    metadata,
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("agent_id", sa.String, nullable=False),
    sa.Column("agent_version", sa.String, nullable=False),
    sa.Column("conversation_id", sa.String, nullable=True),
    sa.Column("parent_turn_id", sa.String, nullable=True),
    sa.Column("root_turn_id", sa.String, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("message_count", sa.Integer, nullable=False),
    sa.Column("cancel_requested", sa.Boolean, nullable=False),
    # Written only by a cancel request (its first reason); saves leave it alone.
    sa.Column("cancel_reason", sa.Text, nullable=True),
    sa.Column("lease_fence", sa.BigInteger, nullable=True),
    sa.Column("next_retry_at", UtcDateTime, nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Column("state", _json(), nullable=False),
    # The turn's tenant, `NO_TENANT` without one: with `conversation_id`, it names the conversation.
    sa.Column("tenant_id", sa.String, nullable=False, server_default=NO_TENANT),
    # When the deadline sweep must next look at a waiting turn (its reminder, then its
    # deadline); NULL for every turn without a deadline. Derived from the state on each save.
    sa.Column("wake_at", UtcDateTime, nullable=True),
    # When the turn entered its current status: never later than `updated_at`, and unlike it
    # unchanged by the saves of a running turn, so indexes over it survive HOT updates.
    sa.Column("status_changed_at", UtcDateTime, nullable=False),
    # The tree's event counter lives on its root's row, which the root's own saves rewrite
    # anyway: they bump it at no extra cost. Not indexed, so a bump stays a HOT update.
    sa.Column("event_position", sa.BigInteger, nullable=False, server_default="0"),
    # The durable backstop of "one active turn per conversation": two creators racing past
    # every other check still cannot both commit a non-terminal turn.
    sa.Index(
        "ix_agent_turns_active_conversation",
        "tenant_id",
        "conversation_id",
        unique=True,
        postgresql_where=sa.text(ACTIVE_TURN_PREDICATE),
        sqlite_where=sa.text(ACTIVE_TURN_PREDICATE),
    ),
    sa.Index("ix_agent_turns_conversation", "conversation_id"),
    sa.Index("ix_agent_turns_parent", "parent_turn_id"),
    sa.Index("ix_agent_turns_root", "root_turn_id"),
    sa.Index("ix_agent_turns_tenant_conversation", "tenant_id", "conversation_id"),
    # The listing of the HTTP API: a tenant's turns, newest first.
    sa.Index("ix_agent_turns_tenant_created", "tenant_id", "created_at", "id"),
    sa.Index("ix_agent_turns_status_changed", "status", "status_changed_at"),
    sa.Index("ix_agent_turns_status_retry", "status", "next_retry_at"),
    sa.Index("ix_agent_turns_wake", "wake_at"),
    postgresql_with={"fillfactor": TURNS_FILLFACTOR},
)

turn_messages = sa.Table(
    "agent_turn_messages",
    metadata,
    # No foreign key to agent_turns: its check, run for every message a step inserts, cost the
    # server about as much as the rest of the step's statement. A message row is only ever
    # written by the save that writes its header (selected from the header's RETURNING, or
    # in its transaction), and `prune` deletes a tree's messages with its turns.
    sa.Column("turn_id", sa.String, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("message_id", sa.String, nullable=False),
    sa.Column("role", sa.String(32), nullable=False),
    sa.Column("payload", _json(), nullable=False),
)

turn_events = sa.Table(
    "agent_turn_events",
    metadata,
    # INTEGER on SQLite, so that the column is the rowid; AUTOINCREMENT below keeps SQLite
    # from reusing the ids of deleted (pruned) rows.
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    # The writing transaction of an event stored before positions existed; NULL since (see above).
    sa.Column("xid", sa.BigInteger, nullable=True),
    sa.Column("event_id", sa.String, nullable=False),
    sa.Column("turn_id", sa.String, nullable=False),
    sa.Column("root_turn_id", sa.String, nullable=False),
    sa.Column("conversation_id", sa.String, nullable=True),
    # The conversation's tenant (`NO_TENANT` without one): an event's conversation is both.
    sa.Column("tenant_id", sa.String, nullable=False, server_default=NO_TENANT),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("payload", _json(), nullable=False),
    sa.Column("root_position", sa.BigInteger, nullable=False),
    sa.Column("conversation_position", sa.BigInteger, nullable=True),
    sa.UniqueConstraint("event_id", name="uq_agent_turn_events_event_id"),
    sa.Index("ix_agent_turn_events_root_position", "root_turn_id", "root_position", unique=True),
    # Only events filed under a conversation: the others are never read through one.
    sa.Index(
        "ix_agent_turn_events_conversation_position",
        "tenant_id",
        "conversation_id",
        "conversation_position",
        unique=True,
        postgresql_where=sa.text(HAS_CONVERSATION),
        sqlite_where=sa.text(HAS_CONVERSATION),
    ),
    sqlite_autoincrement=True,
)

event_conversations = sa.Table(
    "agent_event_conversations",
    metadata,
    sa.Column("tenant_id", sa.String, primary_key=True, server_default=NO_TENANT),
    sa.Column("conversation_id", sa.String, primary_key=True),
    sa.Column("last_position", sa.BigInteger, nullable=False),
)

chat_conversations = sa.Table(
    "agent_chat_conversations",
    metadata,
    sa.Column("tenant_id", sa.String, primary_key=True, server_default=NO_TENANT),
    sa.Column("conversation_id", sa.String, primary_key=True),
    sa.Column("last_seq", sa.Integer, nullable=False),
)

chat_messages = sa.Table(
    "agent_chat_messages",
    metadata,
    sa.Column("tenant_id", sa.String, primary_key=True, server_default=NO_TENANT),
    sa.Column("conversation_id", sa.String, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("message_id", sa.String, nullable=False),
    sa.Column("role", sa.String(32), nullable=False),
    sa.Column("model_visible", sa.Boolean, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("payload", _json(), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.UniqueConstraint(
        "tenant_id", "conversation_id", "message_id", name="uq_agent_chat_messages_conversation_message"
    ),
    sa.Index("ix_agent_chat_messages_model_window", "tenant_id", "conversation_id", "model_visible", "seq"),
)

inbox_conversations = sa.Table(
    "agent_inbox_conversations",
    metadata,
    sa.Column("tenant_id", sa.String, primary_key=True, server_default=NO_TENANT),
    sa.Column("conversation_id", sa.String, primary_key=True),
    sa.Column("last_sequence", sa.Integer, nullable=False),
)

inbox_messages = sa.Table(
    "agent_inbox_messages",
    metadata,
    sa.Column("message_id", sa.String, primary_key=True),
    sa.Column("conversation_id", sa.String, nullable=False),
    sa.Column("sequence", sa.Integer, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("turn_id", sa.String, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    # What the turn started from the message is made of, when the enqueuer said so (the
    # HTTP server does); NULL agent means the workers' AGENT_RUNNER_INBOX_AGENT.
    sa.Column("agent_id", sa.String, nullable=True),
    # The conversation's tenant (`NO_TENANT` without one), which the turn started from the message gets.
    sa.Column("tenant_id", sa.String, nullable=False, server_default=NO_TENANT),
    sa.Column("turn_metadata", _json(), nullable=True),
    sa.UniqueConstraint(
        "tenant_id", "conversation_id", "sequence", name="uq_agent_inbox_messages_conversation_sequence"
    ),
    sa.Index("ix_agent_inbox_messages_conversation_status", "tenant_id", "conversation_id", "status", "sequence"),
    sa.Index("ix_agent_inbox_messages_status_created", "status", "created_at"),
)

turn_leases = sa.Table(
    "agent_turn_leases",
    metadata,
    sa.Column("turn_id", sa.String, primary_key=True),
    sa.Column("owner", sa.String, nullable=True),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
)

turn_steering = sa.Table(
    "agent_turn_steering",
    metadata,
    sa.Column("turn_id", sa.String, nullable=False),
    sa.Column("message_id", sa.String, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("accepted_at", UtcDateTime, nullable=False),
    sa.Column("forwarded", sa.Boolean, nullable=False),
    # The order of a turn's messages; INTEGER on SQLite, so that it is the rowid.
    sa.Column("sequence", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.UniqueConstraint("turn_id", "message_id", name="uq_agent_turn_steering_turn_message"),
    sqlite_autoincrement=True,
)

idempotency_keys = sa.Table(
    "agent_idempotency_keys",
    metadata,
    # "" for a single-tenant server: a primary key column cannot be NULL.
    sa.Column("tenant_id", sa.String, primary_key=True),
    sa.Column("idempotency_key", sa.String, primary_key=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("response_status", sa.Integer, nullable=True),
    sa.Column("response_body", _json(), nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Index("ix_agent_idempotency_keys_created", "created_at"),
)

threads = sa.Table(
    "agent_threads",
    metadata,
    # A thread is its conversation: (tenant_id, conversation_id), `NO_TENANT` without a tenant.
    sa.Column("tenant_id", sa.String, primary_key=True, server_default=NO_TENANT),
    sa.Column("conversation_id", sa.String, primary_key=True),
    sa.Column("thread_id", sa.String, nullable=False),
    sa.Column("metadata", _json(), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Column("deleted_at", UtcDateTime, nullable=True),
    sa.Index("ix_agent_threads_tenant_created", "tenant_id", "created_at"),
)

crons = sa.Table(
    "agent_crons",
    metadata,
    sa.Column("cron_id", sa.String, primary_key=True),
    sa.Column("tenant_id", sa.String, nullable=True),
    sa.Column("thread_id", sa.String, nullable=True),
    sa.Column("assistant_id", sa.String, nullable=False),
    # `workers.schedules.Schedule.to_dict()`: what fires, when, into which stored conversation.
    sa.Column("schedule", _json(), nullable=False),
    sa.Column("payload", _json(), nullable=False),
    sa.Column("enabled", sa.Boolean, nullable=False),
    sa.Column("end_time", UtcDateTime, nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Index("ix_agent_crons_tenant_created", "tenant_id", "created_at"),
)

WEBHOOK_EVENT_TYPES: tuple[str, ...] = (
    "TURN_SUSPENDED",
    "TURN_COMPLETED",
    "TURN_CANCELLED",
    "TURN_FAILED",
    "MAX_ITERATIONS_REACHED",
    "MAX_STEPS_REACHED",
    "BUDGET_EXCEEDED",
)
"""Event types a webhook may report (`store.webhooks.KIND_EVENT_TYPES`); migration 0009 spells out the same list."""

# The webhook deliverer looks for new events of these types by time; only they are indexed.
sa.Index(
    "ix_agent_turn_events_webhook_created",
    turn_events.c.created_at,
    postgresql_where=turn_events.c.type.in_(WEBHOOK_EVENT_TYPES),
    sqlite_where=turn_events.c.type.in_(WEBHOOK_EVENT_TYPES),
)

webhook_deliveries = sa.Table(
    "agent_webhook_deliveries",
    metadata,
    sa.Column("event_id", sa.String, primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("body", _json(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", UtcDateTime, nullable=False),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("last_status_code", sa.Integer, nullable=True),
    sa.Column("event_created_at", UtcDateTime, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Index("ix_agent_webhook_deliveries_due", "status", "next_attempt_at"),
    sa.Index("ix_agent_webhook_deliveries_event_created", "event_created_at"),
)
