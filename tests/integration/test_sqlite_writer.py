"""SQLite writers queue on ``<database>.writer`` (``store/sqlite_writer.py``): a connection
holds the flock from its first write to the end of its transaction, reads never take it,
another thread or process that writes waits for it in the kernel and goes on as it is let
go, and the store's engine uses it for a database file (not for an in-memory one)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from provisioner.store import db
from provisioner.store.sqlite_writer import WriterQueuedConnection, queued_on

Connect = Callable[[], WriterQueuedConnection]


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    return path


def held(database: Path) -> bool:
    """Whether some connection holds the writer lock now (a non-blocking try of our own)."""
    fd = os.open(database.with_name(database.name + ".writer"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops ours, if we got it
    return False


@pytest.fixture
def connect(database: Path) -> Iterator[Callable[[], WriterQueuedConnection]]:
    opened: list[sqlite3.Connection] = []
    factory = queued_on(database)

    def make() -> WriterQueuedConnection:
        conn = sqlite3.connect(database, factory=factory, check_same_thread=False,
                               timeout=30)
        opened.append(conn)
        assert isinstance(conn, WriterQueuedConnection)
        return conn

    yield make
    for conn in opened:
        conn.close()


def test_held_from_the_first_write_to_the_commit(connect: Connect, database: Path) -> None:
    conn = connect()
    conn.execute("SELECT count(*) FROM t").fetchone()
    assert not held(database)  # a read never takes it
    conn.execute("INSERT INTO t (v) VALUES ('a')")
    assert held(database)
    conn.execute("SELECT count(*) FROM t").fetchone()  # in the transaction: still held
    assert held(database)
    conn.commit()
    assert not held(database)
    conn.execute("UPDATE t SET v = 'b'")
    conn.rollback()
    assert not held(database) and conn.execute("SELECT v FROM t").fetchall() == [("a",)]


def test_a_failed_write_keeps_it_until_the_rollback(connect: Connect, database: Path) -> None:
    conn = connect()
    conn.execute("INSERT INTO t (k, v) VALUES (1, 'a')")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO t (k, v) VALUES (1, 'again')")
    assert held(database)  # the transaction with the first row is still open
    conn.rollback()
    assert not held(database)


def test_a_statement_outside_a_transaction_lets_it_go(connect: Connect, database: Path) -> None:
    conn = connect()
    conn.execute("CREATE TABLE u (k INTEGER)")  # DDL: no implicit transaction
    assert not held(database)
    conn.close()
    assert not held(database)


def test_a_second_writer_thread_waits_for_the_commit(connect: Connect, database: Path) -> None:
    first, second = connect(), connect()
    first.execute("INSERT INTO t (v) VALUES ('first')")
    wrote = threading.Event()

    def write() -> None:
        second.execute("INSERT INTO t (v) VALUES ('second')")
        wrote.set()
        second.commit()

    writer = threading.Thread(target=write)
    writer.start()
    assert not wrote.wait(0.3)  # queued on the lock, not failed and not through
    first.commit()
    writer.join(10)
    assert wrote.is_set()
    assert [v for (v,) in first.execute("SELECT v FROM t ORDER BY k")] == ["first", "second"]


def test_a_writer_in_another_process_waits_for_it(connect: Connect, database: Path) -> None:
    conn = connect()
    conn.execute("INSERT INTO t (v) VALUES ('daemon')")
    script = (
        "import sqlite3, sys\n"
        "from pathlib import Path\n"
        "from provisioner.store.sqlite_writer import queued_on\n"
        "p = Path(sys.argv[1])\n"
        "c = sqlite3.connect(p, factory=queued_on(p), timeout=30)\n"
        "print('ready', flush=True)\n"
        "c.execute(\"INSERT INTO t (v) VALUES ('worker')\")\n"
        "c.commit()\n")
    worker = subprocess.Popen([sys.executable, "-c", script, str(database)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(0.5)  # waiting for our commit
        conn.commit()
        assert worker.wait(10) == 0
    finally:
        worker.kill()
        worker.wait()
    assert [v for (v,) in conn.execute("SELECT v FROM t ORDER BY k")] == ["daemon", "worker"]


def test_the_store_engine_queues_writers_of_a_file(database: Path) -> None:
    engine = db.make_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as conn:
            assert isinstance(conn.connection.dbapi_connection, WriterQueuedConnection)
            conn.execute(text("INSERT INTO t (v) VALUES ('x')"))
            assert held(database)
            conn.commit()
            assert not held(database)
    finally:
        engine.dispose()
    memory = db.make_engine("sqlite://")
    try:
        with memory.connect() as conn:
            assert not isinstance(conn.connection.dbapi_connection, WriterQueuedConnection)
    finally:
        memory.dispose()
