"""Cheaper saves: HOT updates of agent_turns (status_changed_at, fillfactor), no message foreign key, a partial event index.

Every step of a turn rewrites its `agent_turns` row with a new `updated_at`. While three
indexes covered that column, each save inserted an entry into every index of the table.
They now cover `status_changed_at` (when the turn entered its status, which a running turn
keeps from step to step) or nothing in its place, so PostgreSQL can keep the new row
version on the same page without touching any index, and the table's pages are filled to
75% by inserts to leave that room.

The foreign key from `agent_turn_messages` to `agent_turns` goes: its check ran for every
message inserted, at about the server cost of the rest of the save. Message rows are only
written by the save of their header, and pruning deletes them with their turns. The index
of events by conversation keeps only the events that have one.

The upgrade fills `status_changed_at` from `updated_at` for existing rows (one pass over
the table), and the new fillfactor applies to pages written from then on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"

# Spelled out rather than imported from store.schema: a migration keeps its own values.
_FILLFACTOR = 75
_HAS_CONVERSATION = "conversation_id IS NOT NULL"


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.drop_index("ix_agent_turns_status_updated", table_name="agent_turns")
    op.drop_index("ix_agent_turns_tenant_conversation", table_name="agent_turns")
    op.drop_index("ix_agent_turns_conversation_updated", table_name="agent_turns")
    with op.batch_alter_table("agent_turns") as batch:
        batch.add_column(sa.Column("status_changed_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE agent_turns SET status_changed_at = updated_at")
    with op.batch_alter_table("agent_turns") as batch:
        batch.alter_column("status_changed_at", existing_type=sa.DateTime(timezone=True), nullable=False)
    op.create_index("ix_agent_turns_conversation", "agent_turns", ["conversation_id"])
    op.create_index("ix_agent_turns_tenant_conversation", "agent_turns", ["tenant_id", "conversation_id"])
    op.create_index("ix_agent_turns_status_changed", "agent_turns", ["status", "status_changed_at"])
    if postgresql:
        op.execute(f"ALTER TABLE agent_turns SET (fillfactor = {_FILLFACTOR})")
    with op.batch_alter_table("agent_turn_messages") as batch:
        batch.drop_constraint("fk_agent_turn_messages_turn_id_agent_turns", type_="foreignkey")
    op.drop_index("ix_agent_turn_events_conversation_position", table_name="agent_turn_events")
    op.create_index(
        "ix_agent_turn_events_conversation_position",
        "agent_turn_events",
        ["conversation_id", "xid", "id"],
        postgresql_where=sa.text(_HAS_CONVERSATION),
        sqlite_where=sa.text(_HAS_CONVERSATION),
    )


def downgrade() -> None:
    op.drop_index("ix_agent_turn_events_conversation_position", table_name="agent_turn_events")
    op.create_index("ix_agent_turn_events_conversation_position", "agent_turn_events", ["conversation_id", "xid", "id"])
    with op.batch_alter_table("agent_turn_messages") as batch:
        batch.create_foreign_key(
            "fk_agent_turn_messages_turn_id_agent_turns", "agent_turns", ["turn_id"], ["id"], ondelete="CASCADE"
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE agent_turns RESET (fillfactor)")
    op.drop_index("ix_agent_turns_status_changed", table_name="agent_turns")
    op.drop_index("ix_agent_turns_tenant_conversation", table_name="agent_turns")
    op.drop_index("ix_agent_turns_conversation", table_name="agent_turns")
    with op.batch_alter_table("agent_turns") as batch:
        batch.drop_column("status_changed_at")
    op.create_index("ix_agent_turns_conversation_updated", "agent_turns", ["conversation_id", "updated_at"])
    op.create_index("ix_agent_turns_tenant_conversation", "agent_turns", ["tenant_id", "conversation_id", "updated_at"])
    op.create_index("ix_agent_turns_status_updated", "agent_turns", ["status", "updated_at"])
