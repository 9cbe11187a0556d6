"""An index for the API's node order (created_at, id): pages without a sort of the fleet

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_node_created_at_id", "node", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_node_created_at_id", table_name="node")
