"""Several daemons on one database: node leases with fencing, instances, singletons, and
the acting instance (and its fencing number) on every history row

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("transition") as batch:
        batch.add_column(sa.Column("instance", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("fence", sa.Integer(), nullable=True))
    op.create_table(
        "node_lease",
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node_id"),
    )
    op.create_index("ix_node_lease_owner", "node_lease", ["owner"])
    op.execute("INSERT INTO node_lease (node_id, fence) SELECT id, 0 FROM node")
    op.create_table(
        "instance",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("api_listen", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "singleton",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("singleton")
    op.drop_table("instance")
    op.drop_index("ix_node_lease_owner", table_name="node_lease")
    op.drop_table("node_lease")
    with op.batch_alter_table("transition") as batch:
        batch.drop_column("fence")
        batch.drop_column("instance")
