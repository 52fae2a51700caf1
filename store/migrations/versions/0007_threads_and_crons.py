"""Threads and crons of LangGraph clients: conversations managed as threads, and schedules made over HTTP."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"


def upgrade() -> None:
    op.create_table(
        "agent_threads",
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("tenant_id", sa.String(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("conversation_id", name="pk_agent_threads"),
    )
    op.create_index("ix_agent_threads_tenant_created", "agent_threads", ["tenant_id", "created_at"])
    op.create_table(
        "agent_crons",
        sa.Column("cron_id", sa.String(), nullable=False),
        sa.Column("tenant_id", sa.String(), nullable=True),
        sa.Column("thread_id", sa.String(), nullable=True),
        sa.Column("assistant_id", sa.String(), nullable=False),
        sa.Column("schedule", sa.JSON(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cron_id", name="pk_agent_crons"),
    )
    op.create_index("ix_agent_crons_tenant_created", "agent_crons", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_crons_tenant_created", table_name="agent_crons")
    op.drop_table("agent_crons")
    op.drop_index("ix_agent_threads_tenant_created", table_name="agent_threads")
    op.drop_table("agent_threads")
