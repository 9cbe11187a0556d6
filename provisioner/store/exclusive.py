"""SQLite is single-daemon: the daemon holds an exclusive lock file next to the database,
and a second daemon on the same file refuses to start with a one-line reason."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from provisioner.errors import ConfigError


class SqliteLock:
    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL, resolved (symlinks, ``..``, a relative path):
    the same file is one lock whatever the URL says around it (``?timeout=30``,
    ``sqlite+pysqlite://``); None for other databases or in-memory SQLite."""
    if not url.startswith("sqlite"):
        return None
    try:
        database = make_url(url).database
    except ArgumentError:
        return None
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    if database.startswith("file:"):  # a URI filename (?uri=true)
        database = database.removeprefix("file:").partition("?")[0]
    return Path(database).resolve()


def lock_sqlite(url: str) -> SqliteLock | None:
    """Take ``<database>.lock`` exclusively (flock: the kernel drops it when the process
    dies, SIGKILL included). ConfigError when another daemon holds it."""
    db_file = sqlite_path(url)
    if db_file is None:
        return None
    path = db_file.with_name(db_file.name + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"another provisioner daemon (pid {holder}) already serves the SQLite database "
            f"{db_file}; SQLite is single-daemon: point several daemons at PostgreSQL "
            "(database_url) instead") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return SqliteLock(fd, path)
