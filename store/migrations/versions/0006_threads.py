"""Threads: the metadata of conversations managed as threads by LangGraph clients.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


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


def downgrade() -> None:
    op.drop_index("ix_agent_threads_tenant_created", table_name="agent_threads")
    op.drop_table("agent_threads")
