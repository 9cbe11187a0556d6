"""Engine creation and schema migrations (alembic). The daemon refuses a newer schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text

from provisioner.errors import SchemaError
from provisioner.store.exclusive import sqlite_path
from provisioner.store.files import private_sqlite_file
from provisioner.store.sqlite_writer import queued_on

_MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x70726F76  # an advisory lock key of our own ("prov")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        private_sqlite_file(url)  # 0600 before SQLite creates it under the umask
        # no pre-ping: a file's connection is never lost, and the ping was a statement more
        # in every one of a node's ~55 store calls
        db_file = sqlite_path(url)
        engine = create_engine(url, connect_args={
            "check_same_thread": False, "timeout": 30,
            # writers queue in the kernel, not in SQLite's sleeping busy handler
            **({"factory": queued_on(db_file)} if db_file is not None else {})})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # no pre-ping either: it was a round trip more in every store call (a third of a node's
    # round trips to PostgreSQL); a connection lost meanwhile fails its call, which the
    # store's retry runs again on a fresh one (store/session.py: the disconnect invalidates
    # every pooled connection older than it, so one retry, not one per pooled connection)
    return create_engine(url, pool_size=8, max_overflow=4,
                         connect_args=_PG_CONNECT_ARGS if url.startswith("postgresql") else {})


#: A daemon cut off from PostgreSQL must not keep row locks (a lease row locked by a fenced
#: write) on the server: its idle transaction ends after 5 s, and TCP keepalives
#: find a dead peer on either side within ~15 s.
_PG_CONNECT_ARGS: dict[str, Any] = {
    "options": "-c idle_in_transaction_session_timeout=5000",
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
}


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process
    # the WAL is folded into the database every ~400 KiB (SQLite's default: 4 MiB) and cut
    # back to 1 MiB after a checkpoint: on a small or full filesystem a WAL that grew to the
    # first checkpoint keeps the space the database needs (the checkpoint can then never
    # run, and writes fail even after space is freed; tests/e2e/test_sqlite_disk_full.py)
    cursor.execute("PRAGMA wal_autocheckpoint=100")
    cursor.execute("PRAGMA journal_size_limit=1048576")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    script = ScriptDirectory(str(_MIGRATIONS))
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Apply pending migrations; return (revision before, revision after)."""
    before = check_not_newer(engine)
    if engine.dialect.name != "postgresql":
        command.upgrade(_alembic_config(engine), "head")
        return before, head_revision()
    # several daemons starting at once on one database: one migrates, the others wait
    # for it and then find the schema at head
    with engine.connect() as lock:
        lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK})
        try:
            command.upgrade(_alembic_config(engine), "head")
        finally:
            lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK})
    return before, head_revision()


def check_not_newer(engine: Engine) -> str | None:
    """Raise SchemaError when the database was migrated by a newer provisioner."""
    current = current_revision(engine)
    script = ScriptDirectory(str(_MIGRATIONS))
    known = {rev.revision for rev in script.walk_revisions()}
    if current is not None and current not in known:
        raise SchemaError(
            f"database schema revision {current} is newer than this provisioner "
            f"(head {head_revision()}); upgrade provisioner"
        )
    return current


def check_current(engine: Engine) -> None:
    """Raise SchemaError unless the schema is exactly at head."""
    current = check_not_newer(engine)
    if current != head_revision():
        raise SchemaError(
            f"database schema is at {current or 'nothing'}, expected {head_revision()}: "
            "run 'provisioner db upgrade'"
        )
