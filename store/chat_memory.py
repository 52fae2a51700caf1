"""`SqlChatMemory`: a conversation's messages in PostgreSQL or SQLite, and its provider."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine

from agent_runner.errors import StoreError, VersionConflictError
from agent_runner.ids import utcnow
from agent_runner.messages import AnyMessage, AnyMessageAdapter, AnyMessagesAdapter, ModelMessage
from agent_runner.persistence import ConversationKey
from agent_runner.store_rules import model_window
from store._backend import SqlBackend
from store._engine import UrlOrEngine, dialect_insert, display_url, driver_cursor, translated_errors, writer
from store.schema import chat_conversations, chat_messages, tenant_key

_SINGLE_STATEMENT_MESSAGES = 32
"""Most messages a PostgreSQL append writes in its single statement; more go through a transaction.

Each count has a statement of its own (compiled once and cached), so the bound keeps both
the statements and their parameter lists small."""

_MESSAGE_COLUMNS = (
    "tenant_id",
    "conversation_id",
    "seq",
    "message_id",
    "role",
    "model_visible",
    "version",
    "payload",
    "created_at",
)


@lru_cache(maxsize=_SINGLE_STATEMENT_MESSAGES)
def _append_statement(added: int) -> postgresql.Insert:
    """The PostgreSQL append of `added` messages as one statement.

    A data-modifying CTE reserves the block of sequence numbers on the conversation's
    counter row (taking its row lock, which orders concurrent appenders as the transaction
    did), and the INSERT numbers the messages from the counter's RETURNING. Parameters:
    `tenant_id`, `conversation_id`, `added`, `created_at`, and `m<i>_<column>` for each message.
    """
    counter = postgresql.insert(chat_conversations).values(
        tenant_id=sa.bindparam("tenant_id"),
        conversation_id=sa.bindparam("conversation_id"),
        last_seq=sa.bindparam("added", type_=sa.Integer),
    )
    reserved = (
        counter.on_conflict_do_update(
            index_elements=[chat_conversations.c.tenant_id, chat_conversations.c.conversation_id],
            set_={"last_seq": chat_conversations.c.last_seq + counter.excluded.last_seq},
        )
        .returning(chat_conversations.c.last_seq)
        .cte("reserved")
    )
    shared = {"tenant_id", "conversation_id", "created_at"}
    selects = []
    for index in range(added):
        columns: list[Any] = []
        for name in _MESSAGE_COLUMNS:
            if name == "seq":
                # The block ends at last_seq: message `index` of `added` takes last_seq - (added - 1 - index).
                columns.append((reserved.c.last_seq - sa.literal_column(str(added - 1 - index))).label(name))
            else:
                key = name if name in shared else f"m{index}_{name}"
                columns.append(sa.bindparam(key, type_=chat_messages.c[name].type).label(name))
        selects.append(sa.select(*columns).select_from(reserved))
    source = selects[0] if added == 1 else sa.union_all(*selects)
    return (
        postgresql.insert(chat_messages)
        .from_select(list(_MESSAGE_COLUMNS), source)
        .on_conflict_do_nothing(index_elements=_UNIQUE_MESSAGE)
    )


_NEWEST = """\
SELECT json_agg(newest.payload ORDER BY newest.seq)::text FROM (
    SELECT payload, seq FROM agent_chat_messages
    WHERE tenant_id = %(tenant_id)s::text AND conversation_id = %(conversation_id)s::text{visible}
    ORDER BY seq DESC LIMIT %(count)s::integer
) AS newest"""
"""The newest messages of a conversation, oldest first, as one JSON array (NULL when there are none).

Run prepared on the driver (see `SqlBackend._direct`): the history read that starts every
turn of a conversation. `json` keeps each payload's text as written, so the array is the
stored payloads put together.
"""

_NEWEST_ANY = " ".join(_NEWEST.format(visible="").split())
_NEWEST_MODEL = " ".join(_NEWEST.format(visible=" AND model_visible").split())


_UNIQUE_MESSAGE = [chat_messages.c.tenant_id, chat_messages.c.conversation_id, chat_messages.c.message_id]
"""A message is unique by its id within its conversation."""


def _message_row(message: AnyMessage) -> dict[str, Any]:
    return {
        "message_id": message.id,
        "role": message.role,
        "model_visible": message.model_visible,
        "version": getattr(message, "version", 0),
        "payload": message.model_dump(mode="json"),
    }


class SqlChatMemory:
    """The `ChatMemory` of one conversation, stored in SQL. Build it with `SqlChatMemoryProvider`.

    Messages are ordered by a per-conversation sequence number and unique by id within the
    conversation, so appending is idempotent: a projection that is retried after a crash
    skips what it already wrote. Page messages change only by compare-and-swap on their
    `version`; nothing is deleted. On PostgreSQL, reads and appends of up to 32 messages are
    single autocommitted statements, one round trip each.

    Args:
        engine: The engine of the chat tables.
        conversation_id: The conversation this memory holds.
        backend: The provider whose connection settings for `engine` to reuse, if any.
        tenant_id: The conversation's tenant (None without tenants).
    """

    def __init__(
        self, engine: Engine, conversation_id: str, *, backend: SqlBackend | None = None, tenant_id: str | None = None
    ) -> None:
        self.conversation_id = conversation_id
        self.tenant_id = tenant_id
        self._tenant = tenant_key(tenant_id)
        self._engine = engine
        self._backend = backend if backend is not None and backend.engine is engine else None
        if backend is not None and backend.engine is engine:
            # The provider's engine views, made once rather than for every memory it hands out.
            self._writer = backend._writer
            self._reader = backend._reader
        else:
            self._writer = writer(engine)
            # See `SqlBackend`: single statements on PostgreSQL run in autocommit.
            postgres = engine.dialect.name == "postgresql"
            self._reader = engine.execution_options(isolation_level="AUTOCOMMIT") if postgres else engine
        self._single_statement = engine.dialect.name == "postgresql"

    def __repr__(self) -> str:
        tenant = "" if self.tenant_id is None else f", tenant_id={self.tenant_id!r}"
        return f"SqlChatMemory({display_url(self._engine.url)!r}, {self.conversation_id!r}{tenant})"

    def get_messages(self, count: int) -> list[AnyMessage]:
        """Return the newest `count` messages of both kinds, oldest first."""
        if count <= 0:
            return []
        return self._newest(count, model_only=False)

    def get_model_messages(self, count: int) -> list[ModelMessage]:
        """Return the newest `count` model-visible messages, oldest first.

        The window never starts with a ToolMessage whose AiMessage falls outside it.
        """
        if count <= 0:
            return []
        return model_window(self._newest(count, model_only=True), count)

    def _newest(self, count: int, *, model_only: bool) -> list[AnyMessage]:
        backend = self._backend
        if backend is not None and backend._direct():
            parameters = {"tenant_id": self._tenant, "conversation_id": self.conversation_id, "count": count}
            with translated_errors(self._engine, f"reading conversation {self.conversation_id!r}"):
                with backend._driver.connection() as lent:
                    cursor = driver_cursor(lent)
                    found = cursor.execute(_NEWEST_MODEL if model_only else _NEWEST_ANY, parameters, prepare=True)
                    payloads = found.fetchone()[0]
            return [] if payloads is None else AnyMessagesAdapter.validate_json(payloads)
        query = sa.select(chat_messages.c.payload).where(*self._names())
        if model_only:
            query = query.where(chat_messages.c.model_visible.is_(True))
        query = query.order_by(chat_messages.c.seq.desc()).limit(count)
        with translated_errors(self._engine, f"reading conversation {self.conversation_id!r}"):
            with self._reader.connect() as connection:
                payloads = list(connection.execute(query).scalars())
        payloads.reverse()
        return AnyMessagesAdapter.validate_python(payloads)

    def get_messages_before(self, message_id: str, count: int) -> list[AnyMessage] | None:
        """Return the newest `count` messages older than `message_id`, oldest first.

        For paging back through a conversation's timeline. Returns None when `message_id`
        is not a message of this conversation.
        """
        position = (
            sa.select(chat_messages.c.seq)
            .where(*self._names(), chat_messages.c.message_id == message_id)
            .scalar_subquery()
        )
        query = (
            sa.select(chat_messages.c.payload)
            .where(*self._names(), chat_messages.c.seq < position)
            .order_by(chat_messages.c.seq.desc())
            .limit(max(0, count))
        )
        exists = sa.select(position.isnot(None))
        with translated_errors(self._engine, f"reading conversation {self.conversation_id!r}"):
            with self._reader.connect() as connection:
                if not connection.execute(exists).scalar():
                    return None
                payloads = list(connection.execute(query).scalars()) if count > 0 else []
        payloads.reverse()
        return AnyMessagesAdapter.validate_python(payloads)

    def get(self, message_id: str) -> AnyMessage | None:
        """Return the message with this id, or None."""
        query = sa.select(chat_messages.c.payload).where(*self._names(), chat_messages.c.message_id == message_id)
        with translated_errors(self._engine, f"reading conversation {self.conversation_id!r}"):
            with self._reader.connect() as connection:
                payload = connection.execute(query).scalar()
        return None if payload is None else AnyMessageAdapter.validate_python(payload)

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Append messages in order; a message whose id is already stored is skipped."""
        if not messages:
            return
        now = utcnow()
        with translated_errors(self._engine, f"appending to conversation {self.conversation_id!r}"):
            if self._single_statement and len(messages) <= _SINGLE_STATEMENT_MESSAGES:
                self._append_in_one_statement(messages, now)
                return
            with self._writer.begin() as connection:
                # Reserve a block of sequence numbers on the conversation's counter row. The
                # row lock orders concurrent appenders; numbers of skipped duplicates are
                # simply never used, which keeps the order without renumbering.
                counter = dialect_insert(connection, chat_conversations).values(
                    tenant_id=self._tenant, conversation_id=self.conversation_id, last_seq=len(messages)
                )
                counter = counter.on_conflict_do_update(
                    index_elements=[chat_conversations.c.tenant_id, chat_conversations.c.conversation_id],
                    set_={"last_seq": chat_conversations.c.last_seq + len(messages)},
                )
                last = connection.execute(counter.returning(chat_conversations.c.last_seq)).scalar_one()
                first = last - len(messages) + 1
                rows = [
                    {
                        "tenant_id": self._tenant,
                        "conversation_id": self.conversation_id,
                        "seq": seq,
                        **_message_row(message),
                        "created_at": now,
                    }
                    for seq, message in enumerate(messages, first)
                ]
                insert = dialect_insert(connection, chat_messages).on_conflict_do_nothing(
                    index_elements=_UNIQUE_MESSAGE
                )
                connection.execute(insert, rows)

    def _append_in_one_statement(self, messages: Sequence[AnyMessage], now: datetime) -> None:
        """The PostgreSQL append: counter and messages in one autocommitted statement, one round trip.

        A statement is atomic by itself, so the sequence block is reserved only if the
        messages are written, as in the transaction it replaces.
        """
        parameters: dict[str, Any] = {
            "tenant_id": self._tenant,
            "conversation_id": self.conversation_id,
            "added": len(messages),
            "created_at": now,
        }
        for index, message in enumerate(messages):
            parameters.update({f"m{index}_{name}": value for name, value in _message_row(message).items()})
        with self._reader.connect() as connection:
            connection.execute(_append_statement(len(messages)), parameters)

    def _names(self) -> tuple[sa.ColumnElement[bool], sa.ColumnElement[bool]]:
        """The conditions that select this conversation's rows: its tenant and its id."""
        return chat_messages.c.tenant_id == self._tenant, chat_messages.c.conversation_id == self.conversation_id

    def update(self, message: AnyMessage, expected_version: int) -> AnyMessage:
        """Replace a page message if its stored version is `expected_version`; return it with version + 1.

        Raises:
            VersionConflictError: The stored version differs (someone else updated it first).
            StoreError: The message is not in this conversation, or is not a page message.
        """
        action = f"updating message {message.id!r} of conversation {self.conversation_id!r}"
        with translated_errors(self._engine, action), self._writer.begin() as connection:
            if not message.model_visible:
                updated = message.model_copy(update={"version": expected_version + 1})
                swapped = connection.execute(
                    sa.update(chat_messages)
                    .where(
                        *self._names(),
                        chat_messages.c.message_id == message.id,
                        chat_messages.c.version == expected_version,
                        chat_messages.c.model_visible.is_(False),
                        chat_messages.c.role == message.role,
                    )
                    .values(version=expected_version + 1, payload=updated.model_dump(mode="json"))
                    .returning(chat_messages.c.seq)
                ).first()
                if swapped is not None:
                    return updated
            stored = connection.execute(
                sa.select(chat_messages.c.role, chat_messages.c.model_visible, chat_messages.c.version).where(
                    *self._names(),
                    chat_messages.c.message_id == message.id,
                )
            ).first()
        if stored is None:
            raise StoreError(f"message {message.id!r} is not in conversation {self.conversation_id!r}")
        if stored.model_visible or stored.role != message.role:
            raise StoreError(f"message {message.id!r} is a {stored.role!r} message; only page messages change")
        raise VersionConflictError(message.id, expected_version, stored.version, what="message")


class SqlChatMemoryProvider(SqlBackend):
    """A `ChatMemoryProvider` over SQL: `provider(conversation_id, tenant_id=...)` returns that conversation's `SqlChatMemory`.

    Every memory it returns shares the provider's engine (and connection pool).

    Args:
        url_or_engine: A database URL or an engine to share. An engine made from a URL is
            disposed of by `close()`; one passed in is left open.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)

    def __call__(self, conversation_id: str, tenant_id: str | None = None) -> SqlChatMemory:
        """Return the memory of the conversation `conversation_id` of `tenant_id`."""
        return SqlChatMemory(self._engine, conversation_id, backend=self, tenant_id=tenant_id)

    def of(self, conversation: ConversationKey) -> SqlChatMemory:
        """Return the memory of `conversation`."""
        return self(conversation.conversation_id, conversation.tenant_id)
