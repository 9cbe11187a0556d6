"""Firmware waves (issue 25): an operator's wave bringing a profile's drifted nodes back to
the baseline, its limits, nodes and status, so a wave survives a daemon restart

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "firmware_wave",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("profile", sa.String(length=128), nullable=False),
        sa.Column("runbook", sa.String(length=64), nullable=False),
        sa.Column("max_nodes", sa.Integer(), nullable=False),
        sa.Column("max_domain_share", sa.Float(), nullable=False),
        sa.Column("max_rack_share", sa.Float(), nullable=False),
        sa.Column("stop_after_failures", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("groups", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("started_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_firmware_wave_profile", "firmware_wave", ["profile"])
    op.create_index("ix_firmware_wave_status", "firmware_wave", ["status"])


def downgrade() -> None:
    op.drop_index("ix_firmware_wave_status", table_name="firmware_wave")
    op.drop_index("ix_firmware_wave_profile", table_name="firmware_wave")
    op.drop_table("firmware_wave")
