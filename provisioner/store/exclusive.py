"""SQLite is single-daemon: the daemon holds an exclusive lock file next to the database,
and a second daemon on the same file refuses to start with a one-line reason."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

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
    """The database file of a SQLite URL; None for other databases or in-memory SQLite."""
    if not url.startswith("sqlite"):
        return None
    _, _, rest = url.partition(":///")
    return Path(rest) if rest and rest != ":memory:" else None


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
