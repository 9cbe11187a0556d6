"""The state directory and the SQLite database are private to the daemon's user: the
directory is created 0700 and the database file 0600 (SQLite gives its ``-wal`` and ``-shm``
files the database's mode), whatever the umask of the shell or unit that started us."""

from __future__ import annotations

import os
from pathlib import Path

from provisioner.store.exclusive import sqlite_path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700; an existing one is left as the
    operator made it (a packaged ``StateDirectoryMode=`` decides there)."""
    if path.is_dir():
        return
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask


def private_sqlite_file(url: str) -> None:
    """Create the SQLite database of ``url`` empty with mode 0600 before SQLite opens it
    (SQLite would create it 0644 under a 022 umask); an existing file is left alone."""
    db_file = sqlite_path(url)
    if db_file is None or db_file.exists():
        return
    db_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(db_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
