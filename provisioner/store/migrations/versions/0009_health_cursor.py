"""Health source cursors (issue 24): per node and source, the last BMC log record read and
the states last reported, so a restarted poller raises no old record again; the repair
ladder's circuit breaker, so a restart keeps it open

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "health_cursor",
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("cursor", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node_id", "source"),
    )
    op.create_table(
        "health_breaker",
        sa.Column("name", sa.String(length=16), nullable=False),
        sa.Column("tripped", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("since", sa.String(length=40), nullable=False),
        sa.Column("held", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("health_breaker")
    op.drop_table("health_cursor")
