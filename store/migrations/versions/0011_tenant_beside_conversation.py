"""The tenant beside the conversation id: every table keyed by conversation keys by (tenant, conversation).

Until now the HTTP server stored a tenant's conversation under the id `<tenant>/<id>`. A
conversation is now named by two columns, `tenant_id` and `conversation_id` (the id as the
tenant named it), and `""` stands for no tenant (key columns cannot be NULL). The upgrade
splits the ids of the earlier form in every table that holds them, moves each unique key
and lookup index to both columns, and sets `tenant_id` to `""` where it was NULL
(`agent_turns`, `agent_inbox_messages`, `agent_threads`). It also rewrites the two JSON
documents that carry a conversation id: a turn's `root_conversation_id` (in `state`) and a
stored cron's schedule. The events stored before keep their payloads: readers take an
event's conversation from its columns. Event positions are unchanged, so the cursors
handed out before stay valid.

Keys change before the ids are split: the conversations `acme/c-1` and `globex/c-1` are
two rows under the old keys and two under the new ones, never one in between.
Processes of an older version cannot work on the new schema: stop them (or replace them)
together with this upgrade.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"

# Spelled out rather than imported from store.schema: a migration keeps its own values.
_ACTIVE_TURN = (
    "status IN ('READY', 'RUNNING', 'WAITING_FOR_USER', 'WAITING_FOR_APPROVAL', 'WAITING_FOR_CHILD', 'RETRY_SCHEDULED')"
)
_HAS_CONVERSATION = "conversation_id IS NOT NULL"
_NO_TENANT = ""
_SEPARATOR = "/"
_BATCH = 500

_TURNS = "agent_turns"
_EVENTS = "agent_turn_events"
_CHAT_MESSAGES = "agent_chat_messages"
_INBOX_MESSAGES = "agent_inbox_messages"
_THREADS = "agent_threads"
_COUNTERS = ("agent_event_conversations", "agent_chat_conversations", "agent_inbox_conversations")
"""Tables of one row per conversation, keyed by it alone until now."""
_SPLIT = (_TURNS, _EVENTS, _CHAT_MESSAGES, _INBOX_MESSAGES, _THREADS, *_COUNTERS)
"""Every table with a `conversation_id` column."""


def _tenant_column() -> sa.Column[Any]:
    return sa.Column("tenant_id", sa.String(), nullable=False, server_default=_NO_TENANT)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    _partial_unique_index("ix_agent_turns_active_conversation", _TURNS, None, _ACTIVE_TURN)
    op.execute(f"UPDATE {_TURNS} SET tenant_id = '' WHERE tenant_id IS NULL")
    if postgres:
        op.alter_column(_TURNS, "tenant_id", existing_type=sa.String(), nullable=False, server_default=_NO_TENANT)
    else:
        with op.batch_alter_table(_TURNS) as batch:
            batch.alter_column("tenant_id", existing_type=sa.String(), nullable=False, server_default=_NO_TENANT)
    _partial_unique_index("ix_agent_turns_active_conversation", _TURNS, ["tenant_id", "conversation_id"], _ACTIVE_TURN)
    _partial_unique_index("ix_agent_turn_events_conversation_position", _EVENTS, None, _HAS_CONVERSATION)
    op.add_column(_EVENTS, _tenant_column())
    _partial_unique_index(
        "ix_agent_turn_events_conversation_position",
        _EVENTS,
        ["tenant_id", "conversation_id", "conversation_position"],
        _HAS_CONVERSATION,
    )
    for table in _COUNTERS:
        _rekey(postgres, table, ["tenant_id", "conversation_id"], add=True)
    _rekey(
        postgres,
        _CHAT_MESSAGES,
        ["tenant_id", "conversation_id", "seq"],
        add=True,
        unique=("uq_agent_chat_messages_conversation_message", ["tenant_id", "conversation_id", "message_id"]),
        index=("ix_agent_chat_messages_model_window", ["tenant_id", "conversation_id", "model_visible", "seq"]),
    )
    _rekey(
        postgres,
        _INBOX_MESSAGES,
        None,
        add=False,
        unique=("uq_agent_inbox_messages_conversation_sequence", ["tenant_id", "conversation_id", "sequence"]),
        index=("ix_agent_inbox_messages_conversation_status", ["tenant_id", "conversation_id", "status", "sequence"]),
    )
    _rekey(postgres, _THREADS, ["tenant_id", "conversation_id"], add=False)
    position = "strpos" if postgres else "instr"
    for table in _SPLIT:
        op.execute(
            f"UPDATE {table} SET tenant_id = substr(conversation_id, 1, {position}(conversation_id, '/') - 1), "
            f"conversation_id = substr(conversation_id, {position}(conversation_id, '/') + 1) "
            "WHERE conversation_id LIKE '%/%'"
        )
    _rewrite_json(_TURNS, "id", "state", _own_root_conversation)
    _rewrite_json("agent_crons", "cron_id", "schedule", _own_schedule_conversation)


def _partial_unique_index(name: str, table: str, columns: list[str] | None, where: str) -> None:
    """Drop the unique index `name` of `table` (`columns` None), or create it over `columns` where `where` holds."""
    if columns is None:
        op.drop_index(name, table_name=table)
        return
    op.create_index(name, table, columns, unique=True, postgresql_where=sa.text(where), sqlite_where=sa.text(where))


def _rekey(
    postgres: bool,
    table: str,
    primary_key: list[str] | None,
    *,
    add: bool,
    unique: tuple[str, list[str]] | None = None,
    index: tuple[str, list[str]] | None = None,
) -> None:
    """Give `table` a NOT NULL `tenant_id` (added, or the nullable one filled) and the keys that start with it."""
    if index is not None:
        op.drop_index(index[0], table_name=table)
    _change_keys(postgres, table, primary_key, add=add, unique=unique)
    if index is not None:
        op.create_index(index[0], table, index[1])


def _change_keys(
    postgres: bool, table: str, primary_key: list[str] | None, *, add: bool, unique: tuple[str, list[str]] | None
) -> None:
    if not add:
        op.execute(f"UPDATE {table} SET tenant_id = '' WHERE tenant_id IS NULL")
    if postgres:
        if add:
            op.add_column(table, _tenant_column())
        else:
            op.alter_column(table, "tenant_id", existing_type=sa.String(), nullable=False, server_default=_NO_TENANT)
        if unique is not None:
            op.drop_constraint(unique[0], table, type_="unique")
            op.create_unique_constraint(unique[0], table, unique[1])
        if primary_key is not None:
            op.drop_constraint(f"pk_{table}", table, type_="primary")
            op.create_primary_key(f"pk_{table}", table, primary_key)
        return
    # SQLite changes keys by rebuilding the table.
    with op.batch_alter_table(table, recreate="always") as batch:
        if add:
            batch.add_column(_tenant_column())
        else:
            batch.alter_column("tenant_id", existing_type=sa.String(), nullable=False, server_default=_NO_TENANT)
        if unique is not None:
            batch.drop_constraint(unique[0], type_="unique")
            batch.create_unique_constraint(unique[0], unique[1])
        if primary_key is not None:
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.create_primary_key(f"pk_{table}", primary_key)


def _own_root_conversation(document: dict[str, Any], tenant_id: str) -> bool:
    """Strip the tenant from a turn state's `root_conversation_id`; whether it changed."""
    return _strip(document, "root_conversation_id", tenant_id)


def _own_schedule_conversation(document: dict[str, Any], tenant_id: str) -> bool:
    """Strip the tenant from a cron schedule's `conversation_id`; whether it changed."""
    return _strip(document, "conversation_id", tenant_id)


def _strip(document: dict[str, Any], key: str, tenant_id: str) -> bool:
    value = document.get(key)
    prefix = f"{tenant_id}{_SEPARATOR}"
    if not tenant_id or not isinstance(value, str) or not value.startswith(prefix):
        return False
    document[key] = value[len(prefix) :]
    return True


Change = Callable[[dict[str, Any], str], bool]
"""Changes a JSON document of a tenant's row in place; returns whether it changed anything."""


def _rewrite_json(table: str, key: str, column: str, change: Change) -> None:
    """Apply `change(document, tenant_id)` to the JSON `column` of each row of a tenant, in batches by `key`."""
    bind = op.get_bind()
    rows = sa.table(
        table, sa.column(key, sa.String()), sa.column("tenant_id", sa.String()), sa.column(column, sa.JSON())
    )
    for batch in _batches(bind, rows, key, column):
        for row_key, tenant_id, document in batch:
            if isinstance(document, dict) and change(document, tenant_id):
                bind.execute(sa.update(rows).where(rows.c[key] == row_key).values({column: document}))


def _batches(bind: sa.Connection, rows: sa.TableClause, key: str, column: str) -> Iterator[list[tuple[Any, ...]]]:
    after: str | None = None
    while True:
        query = sa.select(rows.c[key], rows.c.tenant_id, rows.c[column]).where(
            rows.c.tenant_id.is_not(None), rows.c.tenant_id != _NO_TENANT
        )
        if after is not None:
            query = query.where(rows.c[key] > after)
        batch = [tuple(row) for row in bind.execute(query.order_by(rows.c[key]).limit(_BATCH))]
        if not batch:
            return
        yield batch
        after = batch[-1][0]


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for table in _SPLIT:
        op.execute(
            f"UPDATE {table} SET conversation_id = tenant_id || '/' || conversation_id "
            "WHERE tenant_id <> '' AND conversation_id IS NOT NULL"
        )
    _rewrite_json(_TURNS, "id", "state", _scoped(json_key="root_conversation_id"))
    _rewrite_json("agent_crons", "cron_id", "schedule", _scoped(json_key="conversation_id"))
    _partial_unique_index("ix_agent_turns_active_conversation", _TURNS, None, _ACTIVE_TURN)
    _partial_unique_index("ix_agent_turns_active_conversation", _TURNS, ["conversation_id"], _ACTIVE_TURN)
    _partial_unique_index("ix_agent_turn_events_conversation_position", _EVENTS, None, _HAS_CONVERSATION)
    _partial_unique_index(
        "ix_agent_turn_events_conversation_position",
        _EVENTS,
        ["conversation_id", "conversation_position"],
        _HAS_CONVERSATION,
    )
    # The ids hold the tenant again: the old keys take them as they are; the tenant columns
    # go back to NULL for no tenant, or go.
    op.drop_index("ix_agent_chat_messages_model_window", table_name=_CHAT_MESSAGES)
    op.drop_index("ix_agent_inbox_messages_conversation_status", table_name=_INBOX_MESSAGES)
    for table, primary_key, unique in (
        *((table, ["conversation_id"], None) for table in _COUNTERS),
        (_CHAT_MESSAGES, ["conversation_id", "seq"], ("uq_agent_chat_messages_conversation_message", "message_id")),
        (_INBOX_MESSAGES, None, ("uq_agent_inbox_messages_conversation_sequence", "sequence")),
        (_THREADS, ["conversation_id"], None),
    ):
        drop = table not in (_INBOX_MESSAGES, _THREADS)
        with op.batch_alter_table(table, recreate="always" if not postgres else "auto") as batch:
            if unique is not None:
                batch.drop_constraint(unique[0], type_="unique")
                batch.create_unique_constraint(unique[0], ["conversation_id", unique[1]])
            if primary_key is not None:
                batch.drop_constraint(f"pk_{table}", type_="primary")
                batch.create_primary_key(f"pk_{table}", primary_key)
            if drop:
                batch.drop_column("tenant_id")
            else:
                batch.alter_column("tenant_id", existing_type=sa.String(), nullable=True, server_default=None)
        if not drop:
            op.execute(f"UPDATE {table} SET tenant_id = NULL WHERE tenant_id = ''")
    op.create_index("ix_agent_chat_messages_model_window", _CHAT_MESSAGES, ["conversation_id", "model_visible", "seq"])
    op.create_index(
        "ix_agent_inbox_messages_conversation_status", _INBOX_MESSAGES, ["conversation_id", "status", "sequence"]
    )
    with op.batch_alter_table(_EVENTS, table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("tenant_id")
    with op.batch_alter_table(_TURNS) as batch:
        batch.alter_column("tenant_id", existing_type=sa.String(), nullable=True, server_default=None)
    op.execute(f"UPDATE {_TURNS} SET tenant_id = NULL WHERE tenant_id = ''")


def _scoped(json_key: str) -> Change:
    def change(document: dict[str, Any], tenant_id: str) -> bool:
        value = document.get(json_key)
        if not tenant_id or not isinstance(value, str) or _SEPARATOR in value:
            return False
        document[json_key] = f"{tenant_id}{_SEPARATOR}{value}"
        return True

    return change
