"""A BMC password being rotated in: kept (encrypted) beside the current one until a fresh
login with it succeeded, so a crash mid-rotation never loses the password the BMC has

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.add_column(sa.Column("bmc_password_pending_enc", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.drop_column("bmc_password_pending_enc")
