"""DHCP leases; node power state and BMC MAC for power sync and zero-touch BMC matching

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(sa.Column("power_state", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("power_checked_at", sa.DateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column("bmc_mac", sa.String(length=17), nullable=True))
    op.create_table(
        "lease",
        sa.Column("mac", sa.String(length=17), nullable=False),
        sa.Column("ip", sa.String(length=45), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=True),
        sa.Column("hostname", sa.String(length=253), nullable=True),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("mac"),
        sa.UniqueConstraint("ip"),
    )


def downgrade() -> None:
    op.drop_table("lease")
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_column("bmc_mac")
        batch_op.drop_column("power_checked_at")
        batch_op.drop_column("power_state")
