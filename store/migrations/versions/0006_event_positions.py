"""Event positions: each turn tree and conversation numbers its events in commit order.

Until now a read of the event log returned only the events of transactions below the
oldest transaction still running anywhere on the database server (`pg_snapshot_xmin`),
so a transaction left open in another database of the same server held every event
stream back. Each event now gets its place in its turn tree (`root_position`) and in its
conversation (`conversation_position`) from a counter per scope (`event_position` on
the tree's root row in `agent_turns`, a row of `agent_event_conversations` per
conversation), bumped by the statement that writes the event; the counter's row lock
makes the saves of one scope commit in the order of their positions, so readers page by
position and see an event as soon as its save commits.

The upgrade numbers the existing events of each scope in the order they were read until
now (transaction id, then id), so every existing log reads as before, and sets the
counters to the last position of each scope. `xid` stays, NULL for events written from
now on, so the `<xid>.<id>` cursors issued before keep working (see `store._event_log`).
Processes of an older version cannot write events on the new schema: stop them (or
replace them) together with this upgrade.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"

# Spelled out rather than imported from store.schema: a migration keeps its own values.
_HAS_CONVERSATION = "conversation_id IS NOT NULL"
_EVENTS = "agent_turn_events"

_NUMBER_EVENTS = """
UPDATE agent_turn_events SET root_position = numbered.root_position,
    conversation_position = numbered.conversation_position
FROM (
    SELECT id,
        row_number() OVER (PARTITION BY root_turn_id ORDER BY xid, id) AS root_position,
        CASE WHEN conversation_id IS NOT NULL
            THEN row_number() OVER (PARTITION BY conversation_id ORDER BY xid, id) END AS conversation_position
    FROM agent_turn_events
) AS numbered
WHERE agent_turn_events.id = numbered.id
"""

_FILL_COUNTERS = (
    """
UPDATE agent_turns SET event_position = (
    SELECT max(root_position) FROM agent_turn_events WHERE agent_turn_events.root_turn_id = agent_turns.id
)
WHERE id IN (SELECT root_turn_id FROM agent_turn_events)
""",
    """
INSERT INTO agent_event_conversations (conversation_id, last_position)
SELECT conversation_id, max(conversation_position) FROM agent_turn_events
WHERE conversation_id IS NOT NULL GROUP BY conversation_id
""",
)


def upgrade() -> None:
    op.create_table(
        "agent_event_conversations",
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("last_position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", name="pk_agent_event_conversations"),
    )
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column("agent_turns", sa.Column("event_position", sa.BigInteger(), nullable=False, server_default="0"))
    op.drop_index("ix_agent_turn_events_conversation_position", table_name=_EVENTS)
    op.drop_index("ix_agent_turn_events_root_position", table_name=_EVENTS)
    # SQLite rebuilds the table for these changes: keep its AUTOINCREMENT.
    with op.batch_alter_table(_EVENTS, table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("root_position", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("conversation_position", sa.BigInteger(), nullable=True))
    op.execute(_NUMBER_EVENTS)
    with op.batch_alter_table(_EVENTS, table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("root_position", existing_type=sa.BigInteger(), nullable=False)
        batch.alter_column("xid", existing_type=sa.BigInteger(), nullable=True)
    op.create_index("ix_agent_turn_events_root_position", _EVENTS, ["root_turn_id", "root_position"], unique=True)
    op.create_index(
        "ix_agent_turn_events_conversation_position",
        _EVENTS,
        ["conversation_id", "conversation_position"],
        unique=True,
        postgresql_where=sa.text(_HAS_CONVERSATION),
        sqlite_where=sa.text(_HAS_CONVERSATION),
    )
    for statement in _FILL_COUNTERS:
        op.execute(statement)


def downgrade() -> None:
    # Events written since the upgrade have no transaction id. On SQLite ids follow commit
    # order (xid 0, as before); on PostgreSQL they get this transaction's id, after every
    # older event, in id order.
    if op.get_bind().dialect.name == "postgresql":
        op.execute("UPDATE agent_turn_events SET xid = pg_current_xact_id()::text::bigint WHERE xid IS NULL")
    else:
        op.execute("UPDATE agent_turn_events SET xid = 0 WHERE xid IS NULL")
    op.drop_index("ix_agent_turn_events_conversation_position", table_name=_EVENTS)
    op.drop_index("ix_agent_turn_events_root_position", table_name=_EVENTS)
    with op.batch_alter_table(_EVENTS, table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("xid", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_column("conversation_position")
        batch.drop_column("root_position")
    op.create_index("ix_agent_turn_events_root_position", _EVENTS, ["root_turn_id", "xid", "id"])
    op.create_index(
        "ix_agent_turn_events_conversation_position",
        _EVENTS,
        ["conversation_id", "xid", "id"],
        postgresql_where=sa.text(_HAS_CONVERSATION),
        sqlite_where=sa.text(_HAS_CONVERSATION),
    )
    with op.batch_alter_table("agent_turns") as batch:
        batch.drop_column("event_position")
    op.drop_table("agent_event_conversations")
