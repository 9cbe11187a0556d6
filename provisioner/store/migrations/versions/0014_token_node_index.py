"""An index on the agent tokens' node: each iPXE script a node is served replaces its
tokens (``TokenRepo.replace_for_node`` deletes them by node), and a deleted node's tokens
go with it; without the index both scanned every token of the fleet

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_api_token_node_id", "api_token", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_api_token_node_id", table_name="api_token")
