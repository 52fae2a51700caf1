"""`SqlChatMemory`: a conversation's messages in PostgreSQL or SQLite, and its provider."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent_runner._base import utcnow
from agent_runner.errors import StoreError, VersionConflictError
from agent_runner.in_memory import model_window
from agent_runner.messages import AnyMessage, AnyMessageAdapter, AnyMessagesAdapter, ModelMessage
from store._backend import SqlBackend
from store._engine import UrlOrEngine, dialect_insert, display_url, translated_errors, writer
from store.schema import chat_conversations, chat_messages


class SqlChatMemory:
    """The `ChatMemory` of one conversation, stored in SQL. Build it with `SqlChatMemoryProvider`.

    Messages are ordered by a per-conversation sequence number and unique by id within the
    conversation, so appending is idempotent: a projection that is retried after a crash
    skips what it already wrote. Page messages change only by compare-and-swap on their
    `version`; nothing is deleted.
    """

    def __init__(self, engine: Engine, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        self._engine = engine
        self._writer = writer(engine)

    def __repr__(self) -> str:
        return f"SqlChatMemory({display_url(self._engine.url)!r}, {self.conversation_id!r})"

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
        query = sa.select(chat_messages.c.payload).where(chat_messages.c.conversation_id == self.conversation_id)
        if model_only:
            query = query.where(chat_messages.c.model_visible.is_(True))
        query = query.order_by(chat_messages.c.seq.desc()).limit(count)
        with translated_errors(self._engine, f"reading conversation {self.conversation_id!r}"):
            with self._engine.connect() as connection:
                payloads = list(connection.execute(query).scalars())
        payloads.reverse()
        return AnyMessagesAdapter.validate_python(payloads)

    def get(self, message_id: str) -> AnyMessage | None:
        """Return the message with this id, or None."""
        query = sa.select(chat_messages.c.payload).where(
            chat_messages.c.conversation_id == self.conversation_id, chat_messages.c.message_id == message_id
        )
        with translated_errors(self._engine, f"reading conversation {self.conversation_id!r}"):
            with self._engine.connect() as connection:
                payload = connection.execute(query).scalar()
        return None if payload is None else AnyMessageAdapter.validate_python(payload)

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Append messages in order; a message whose id is already stored is skipped."""
        if not messages:
            return
        now = utcnow()
        with translated_errors(self._engine, f"appending to conversation {self.conversation_id!r}"):
            with self._writer.begin() as connection:
                # Reserve a block of sequence numbers on the conversation's counter row. The
                # row lock orders concurrent appenders; numbers of skipped duplicates are
                # simply never used, which keeps the order without renumbering.
                counter = dialect_insert(connection, chat_conversations).values(
                    conversation_id=self.conversation_id, last_seq=len(messages)
                )
                counter = counter.on_conflict_do_update(
                    index_elements=[chat_conversations.c.conversation_id],
                    set_={"last_seq": chat_conversations.c.last_seq + len(messages)},
                )
                last = connection.execute(counter.returning(chat_conversations.c.last_seq)).scalar_one()
                first = last - len(messages) + 1
                rows = [
                    {
                        "conversation_id": self.conversation_id,
                        "seq": seq,
                        "message_id": message.id,
                        "role": message.role,
                        "model_visible": message.model_visible,
                        "version": getattr(message, "version", 0),
                        "payload": message.model_dump(mode="json"),
                        "created_at": now,
                    }
                    for seq, message in enumerate(messages, first)
                ]
                insert = dialect_insert(connection, chat_messages).on_conflict_do_nothing(
                    index_elements=[chat_messages.c.conversation_id, chat_messages.c.message_id]
                )
                connection.execute(insert, rows)

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
                        chat_messages.c.conversation_id == self.conversation_id,
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
                    chat_messages.c.conversation_id == self.conversation_id,
                    chat_messages.c.message_id == message.id,
                )
            ).first()
        if stored is None:
            raise StoreError(f"message {message.id!r} is not in conversation {self.conversation_id!r}")
        if stored.model_visible or stored.role != message.role:
            raise StoreError(f"message {message.id!r} is a {stored.role!r} message; only page messages change")
        raise VersionConflictError(message.id, expected_version, stored.version, what="message")


class SqlChatMemoryProvider(SqlBackend):
    """A `ChatMemoryProvider` over SQL: `provider(conversation_id)` returns that conversation's `SqlChatMemory`.

    Every memory it returns shares the provider's engine (and connection pool).

    Args:
        url_or_engine: A database URL or an engine to share. An engine made from a URL is
            disposed of by `close()`; one passed in is left open.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)

    def __call__(self, conversation_id: str) -> SqlChatMemory:
        """Return the conversation's memory."""
        return SqlChatMemory(self._engine, conversation_id)
