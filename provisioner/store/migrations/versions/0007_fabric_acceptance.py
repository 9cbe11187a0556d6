"""Fabric acceptance: one row per acceptance run of an NVLink domain, with its judged result

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fabric_acceptance",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("domain", sa.String(length=128), nullable=False),
        sa.Column("fabric_class", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("summary", sa.String(length=4096), nullable=False),
        sa.Column("slowest", sa.String(length=253), nullable=True),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.String(length=128), nullable=False),
        sa.Column("instance", sa.String(length=128), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_fabric_acceptance_domain_started", "fabric_acceptance",
                    ["domain", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_fabric_acceptance_domain_started", table_name="fabric_acceptance")
    op.drop_table("fabric_acceptance")
