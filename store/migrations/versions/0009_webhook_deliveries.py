"""Webhook deliveries: the delivery log of the webhooks, and an index to find new events by time.

`agent_webhook_deliveries` holds one row per event owed to a webhook (keyed by the event id)
with its attempts and outcome; rows left DEAD are the dead letters. The partial index on
`agent_turn_events.created_at` covers only the event types a webhook reports, so the
deliverer's look for new events reads a few index entries, not the whole log.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"

# The same list as `store.schema.WEBHOOK_EVENT_TYPES` when this revision was written.
_WEBHOOK_TYPES = "type IN ('TURN_SUSPENDED', 'TURN_COMPLETED', 'TURN_CANCELLED', 'TURN_FAILED', " + (
    "'MAX_ITERATIONS_REACHED', 'MAX_STEPS_REACHED', 'BUDGET_EXCEEDED')"
)


def upgrade() -> None:
    op.create_table(
        "agent_webhook_deliveries",
        sa.Column("event_id", sa.String, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("last_status_code", sa.Integer, nullable=True),
        sa.Column("event_created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name="pk_agent_webhook_deliveries"),
    )
    op.create_index("ix_agent_webhook_deliveries_due", "agent_webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_agent_webhook_deliveries_event_created", "agent_webhook_deliveries", ["event_created_at"])
    op.create_index(
        "ix_agent_turn_events_webhook_created",
        "agent_turn_events",
        ["created_at"],
        postgresql_where=sa.text(_WEBHOOK_TYPES),
        sqlite_where=sa.text(_WEBHOOK_TYPES),
    )


def downgrade() -> None:
    op.drop_index("ix_agent_turn_events_webhook_created", table_name="agent_turn_events")
    op.drop_table("agent_webhook_deliveries")
