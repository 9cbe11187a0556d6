"""An index on the history's time (issue 30): the fleet-wide audit's ``since``/``until``
and the hourly retention prune read by it instead of scanning every row

Revision ID: 0011
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_transition_created_at", "transition", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_transition_created_at", table_name="transition")
