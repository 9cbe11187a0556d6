"""One SQLite writer at a time, queued in the kernel rather than in SQLite's busy handler.

SQLite lets one connection write at a time; a second writer that finds the database locked
waits in its busy handler, which sleeps 1, 2, 5, 10 … 100 ms between tries and so wakes up
to 100 ms after the lock was let go. The daemon writes from three threads (the store's, the
boot store's two: leases and agent tokens) and its DHCP workers from their own processes; in
a boot storm of 1,000 PXE clients these sleeps were most of what a boot script waited for
(its lease read and its token write: 0.11 s and 0.25 s at the median client, up to 1.1 s).

A connection of the class ``queued_on(database)`` gives (``sqlite3.connect``'s ``factory``)
takes an exclusive ``flock`` on ``<database>.writer`` before its first statement that is not
a ``SELECT`` and lets it go when its transaction ends (commit, rollback, or a statement that
ran outside one). ``flock`` blocks in the kernel with the GIL released and wakes the next
writer as the lock is let go; each connection has its own open file, so the daemon's threads
queue on it as its processes do. SQLite's own lock and busy timeout still guard the file
against every other writer (the ``sqlite3`` shell, a migration run by hand).

The wait has no timeout of its own: it lasts as long as the holder's transaction, and our
transactions wait on nothing but SQLite (bounded by its busy timeout: a statement that
times out fails its transaction, which the store rolls back, letting the lock go), so a
wait ends when the holder commits, rolls back or dies (the kernel drops a dead process's
``flock``).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path
from typing import Any

#: The statements that never take SQLite's write lock. Anything else queues, a ``PRAGMA``
#: or a read-only ``WITH`` too: queueing a read costs a turn, skipping a write would put it
#: back in SQLite's busy handler.
_READ = "SELECT"


def queued_on(db_file: Path) -> type[WriterQueuedConnection]:
    """The connection class whose writes queue on ``<db_file>.writer``."""
    return type("WriterQueuedConnection", (WriterQueuedConnection,),
                {"lock_path": db_file.with_name(db_file.name + ".writer")})


class WriterQueuedConnection(sqlite3.Connection):
    """A ``sqlite3`` connection whose writes queue on ``lock_path`` (see ``queued_on``)."""

    lock_path: Path

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                    0o600)
        except OSError:  # a reader without write access to the state directory (it
            self._lock_fd = -1  # cannot write the database either): SQLite's lock alone
        self._held = False

    def cursor(self, factory: Any = None) -> Any:
        return super().cursor(factory or WriterQueuedCursor)

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> Any:
        return self.cursor().executemany(sql, parameters)

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.let_go()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.let_go()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._held = False
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing drops the flock
                self._lock_fd = -1

    def queue_for(self, sql: str) -> None:
        """Wait for the writer lock before ``sql`` unless it only reads or we hold it."""
        if self._held or self._lock_fd < 0 or sql.lstrip()[:6].upper() == _READ:
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)  # releases the GIL while it waits
        self._held = True

    def let_go(self) -> None:
        """Let the next writer in, unless a transaction is still open."""
        if self._held and not self.in_transaction:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._held = False


class WriterQueuedCursor(sqlite3.Cursor):
    connection: WriterQueuedConnection

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        self.connection.queue_for(sql)
        try:
            return super().execute(sql, parameters)
        finally:
            self.connection.let_go()  # a statement outside a transaction is done

    def executemany(self, sql: str, parameters: Any, /) -> Any:
        self.connection.queue_for(sql)
        try:
            return super().executemany(sql, parameters)
        finally:
            self.connection.let_go()
