"""Idempotency keys of the HTTP API; inbox messages remember the agent, tenant and metadata of their turn; an index for listing a tenant's turns."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"


def upgrade() -> None:
    op.create_index("ix_agent_turns_tenant_created", "agent_turns", ["tenant_id", "created_at", "id"])

    with op.batch_alter_table("agent_inbox_messages") as batch:
        batch.add_column(sa.Column("agent_id", sa.String(), nullable=True))
        batch.add_column(sa.Column("tenant_id", sa.String(), nullable=True))
        batch.add_column(sa.Column("turn_metadata", sa.JSON(), nullable=True))

    op.create_table(
        "agent_idempotency_keys",
        sa.Column("tenant_id", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("response_body", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "idempotency_key", name="pk_agent_idempotency_keys"),
    )
    op.create_index("ix_agent_idempotency_keys_created", "agent_idempotency_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_idempotency_keys_created", table_name="agent_idempotency_keys")
    op.drop_table("agent_idempotency_keys")
    with op.batch_alter_table("agent_inbox_messages") as batch:
        batch.drop_column("turn_metadata")
        batch.drop_column("tenant_id")
        batch.drop_column("agent_id")
    op.drop_index("ix_agent_turns_tenant_created", table_name="agent_turns")
