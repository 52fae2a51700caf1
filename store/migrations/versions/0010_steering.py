"""Steering messages: the user messages accepted for a running turn, until it applies them.

One row per message, unique per turn and message id, ordered by `sequence`; `forwarded` marks the
messages an ended turn handed on (see `store.turns.steering_messages`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"


def upgrade() -> None:
    op.create_table(
        "agent_turn_steering",
        sa.Column("turn_id", sa.String, nullable=False),
        sa.Column("message_id", sa.String, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("forwarded", sa.Boolean, nullable=False),
        sa.Column("sequence", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False, autoincrement=True),
        sa.PrimaryKeyConstraint("sequence", name="pk_agent_turn_steering"),
        sa.UniqueConstraint("turn_id", "message_id", name="uq_agent_turn_steering_turn_message"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("agent_turn_steering")
