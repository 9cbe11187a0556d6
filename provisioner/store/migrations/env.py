"""Alembic environment: the engine is handed in by provisioner.store.db."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import provisioner.store.models  # noqa: F401  (registers the tables)

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    context.run_migrations()
