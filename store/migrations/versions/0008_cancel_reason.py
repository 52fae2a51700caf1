"""The reason of a RUNNING turn's cancel request: the `cancel_reason` column, kept until the turn ends with it."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"


def upgrade() -> None:
    # A nullable column without a default: PostgreSQL adds it without rewriting the table,
    # and the turns flagged before it existed end with the policy's reason, as they did.
    op.add_column("agent_turns", sa.Column("cancel_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_turns") as batch:
        batch.drop_column("cancel_reason")
