"""Deadlines of waiting turns: the `wake_at` column the deadline sweep reads, and its index."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"


def upgrade() -> None:
    # No turn had a deadline before this revision, so every existing row stays NULL.
    op.add_column("agent_turns", sa.Column("wake_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_agent_turns_wake", "agent_turns", ["wake_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_turns_wake", table_name="agent_turns")
    with op.batch_alter_table("agent_turns") as batch:
        batch.drop_column("wake_at")
