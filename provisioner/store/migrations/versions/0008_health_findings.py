"""Health findings (issue 24): one row per (node, origin, class, subject) with first and last
sighting, clearing and silence; per-node silences of a class

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "health_finding",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("health_class", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("evidence", sa.String(length=2048), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silenced_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silence_reason", sa.String(length=1024), nullable=False),
        sa.Column("silenced_by", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id", "origin", "health_class", "subject",
                            name="uq_health_finding_key"),
    )
    op.create_index("ix_health_finding_node_id", "health_finding", ["node_id"])
    op.create_index("ix_health_finding_open", "health_finding", ["cleared_at", "health_class"])
    op.create_table(
        "health_silence",
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("health_class", sa.String(length=32), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node_id", "health_class"),
    )


def downgrade() -> None:
    op.drop_table("health_silence")
    op.drop_index("ix_health_finding_open", table_name="health_finding")
    op.drop_index("ix_health_finding_node_id", table_name="health_finding")
    op.drop_table("health_finding")
