"""Event log table; tenant_id and root_turn_id indexes on turns."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"


def upgrade() -> None:
    op.add_column("agent_turns", sa.Column("tenant_id", sa.String(), nullable=True))
    # The tenant was kept in the state JSON until now; copy it into the column.
    if op.get_bind().dialect.name == "postgresql":
        op.execute("UPDATE agent_turns SET tenant_id = state->>'tenant_id' WHERE state->>'tenant_id' IS NOT NULL")
    else:
        op.execute(
            "UPDATE agent_turns SET tenant_id = json_extract(state, '$.tenant_id') "
            "WHERE json_extract(state, '$.tenant_id') IS NOT NULL"
        )
    op.create_index("ix_agent_turns_root", "agent_turns", ["root_turn_id"])
    op.create_index("ix_agent_turns_tenant_conversation", "agent_turns", ["tenant_id", "conversation_id", "updated_at"])

    op.create_table(
        "agent_turn_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=False),
        sa.Column("event_id", sa.String(), nullable=False),
        sa.Column("turn_id", sa.String(), nullable=False),
        sa.Column("root_turn_id", sa.String(), nullable=False),
        sa.Column("conversation_id", sa.String(), nullable=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_agent_turn_events"),
        sa.UniqueConstraint("event_id", name="uq_agent_turn_events_event_id"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_agent_turn_events_root_position", "agent_turn_events", ["root_turn_id", "xid", "id"])
    op.create_index("ix_agent_turn_events_conversation_position", "agent_turn_events", ["conversation_id", "xid", "id"])


def downgrade() -> None:
    op.drop_index("ix_agent_turn_events_conversation_position", table_name="agent_turn_events")
    op.drop_index("ix_agent_turn_events_root_position", table_name="agent_turn_events")
    op.drop_table("agent_turn_events")
    op.drop_index("ix_agent_turns_tenant_conversation", table_name="agent_turns")
    op.drop_index("ix_agent_turns_root", table_name="agent_turns")
    with op.batch_alter_table("agent_turns") as batch:
        batch.drop_column("tenant_id")
