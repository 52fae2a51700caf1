"""Turns, turn messages, chat memory, inbox and turn leases."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None

# Spelled out rather than imported: a migration must keep creating the schema of its own
# revision even after the application's status list grows.
_ACTIVE_TURN = (
    "status IN ('READY', 'RUNNING', 'WAITING_FOR_USER', 'WAITING_FOR_APPROVAL', 'WAITING_FOR_CHILD', 'RETRY_SCHEDULED')"
)


def _timestamp(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "agent_turns",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("agent_id", sa.String(), nullable=False),
        sa.Column("agent_version", sa.String(), nullable=False),
        sa.Column("conversation_id", sa.String(), nullable=True),
        sa.Column("parent_turn_id", sa.String(), nullable=True),
        sa.Column("root_turn_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("lease_fence", sa.BigInteger(), nullable=True),
        _timestamp("next_retry_at", nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_agent_turns"),
    )
    op.create_index(
        "ix_agent_turns_active_conversation",
        "agent_turns",
        ["conversation_id"],
        unique=True,
        postgresql_where=sa.text(_ACTIVE_TURN),
        sqlite_where=sa.text(_ACTIVE_TURN),
    )
    op.create_index("ix_agent_turns_conversation_updated", "agent_turns", ["conversation_id", "updated_at"])
    op.create_index("ix_agent_turns_parent", "agent_turns", ["parent_turn_id"])
    op.create_index("ix_agent_turns_status_updated", "agent_turns", ["status", "updated_at"])
    op.create_index("ix_agent_turns_status_retry", "agent_turns", ["status", "next_retry_at"])

    op.create_table(
        "agent_turn_messages",
        sa.Column("turn_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["agent_turns.id"], name="fk_agent_turn_messages_turn_id_agent_turns", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("turn_id", "seq", name="pk_agent_turn_messages"),
    )

    op.create_table(
        "agent_chat_conversations",
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", name="pk_agent_chat_conversations"),
    )
    op.create_table(
        "agent_chat_messages",
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("model_visible", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("conversation_id", "seq", name="pk_agent_chat_messages"),
        sa.UniqueConstraint("conversation_id", "message_id", name="uq_agent_chat_messages_conversation_message"),
    )
    op.create_index(
        "ix_agent_chat_messages_model_window", "agent_chat_messages", ["conversation_id", "model_visible", "seq"]
    )

    op.create_table(
        "agent_inbox_conversations",
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", name="pk_agent_inbox_conversations"),
    )
    op.create_table(
        "agent_inbox_messages",
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("turn_id", sa.String(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("message_id", name="pk_agent_inbox_messages"),
        sa.UniqueConstraint("conversation_id", "sequence", name="uq_agent_inbox_messages_conversation_sequence"),
    )
    op.create_index(
        "ix_agent_inbox_messages_conversation_status", "agent_inbox_messages", ["conversation_id", "status", "sequence"]
    )
    op.create_index("ix_agent_inbox_messages_status_created", "agent_inbox_messages", ["status", "created_at"])

    op.create_table(
        "agent_turn_leases",
        sa.Column("turn_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("turn_id", name="pk_agent_turn_leases"),
    )


def downgrade() -> None:
    op.drop_table("agent_turn_leases")
    op.drop_index("ix_agent_inbox_messages_status_created", table_name="agent_inbox_messages")
    op.drop_index("ix_agent_inbox_messages_conversation_status", table_name="agent_inbox_messages")
    op.drop_table("agent_inbox_messages")
    op.drop_table("agent_inbox_conversations")
    op.drop_index("ix_agent_chat_messages_model_window", table_name="agent_chat_messages")
    op.drop_table("agent_chat_messages")
    op.drop_table("agent_chat_conversations")
    op.drop_table("agent_turn_messages")
    op.drop_index("ix_agent_turns_status_retry", table_name="agent_turns")
    op.drop_index("ix_agent_turns_status_updated", table_name="agent_turns")
    op.drop_index("ix_agent_turns_parent", table_name="agent_turns")
    op.drop_index("ix_agent_turns_conversation_updated", table_name="agent_turns")
    op.drop_index("ix_agent_turns_active_conversation", table_name="agent_turns")
    op.drop_table("agent_turns")
