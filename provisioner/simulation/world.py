"""SimWorld: the simulated machines' hardware state, in its own SQLite file.

It lives outside the daemon's store, as real hardware does, so it survives a daemon killed
with SIGKILL. Every operation is idempotent the way real hardware is (powering on a node that
is on changes nothing) and counts, per machine, the calls and the effects (calls that changed
something): a crash test asserts no side effect happened twice.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from provisioner.errors import StoreUnavailable

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS machine (
    key TEXT NOT NULL, attr TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (key, attr));
CREATE TABLE IF NOT EXISTS ledger (
    key TEXT NOT NULL, op TEXT NOT NULL, calls INTEGER NOT NULL DEFAULT 0,
    effects INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key, op));
CREATE TABLE IF NOT EXISTS reads (
    key TEXT NOT NULL, attr TEXT NOT NULL, calls INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, attr));
"""

DEFAULTS = {"power": "off", "bootdev": "disk", "disk": "", "configured": "",
            "kube": "", "slurm": ""}


class SimWorld:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # timeout: several daemons (the HA chaos test) may share one world
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=30)
        self._db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;" + _SCHEMA)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simworld")
        # reads change nothing: counted in memory, written to the ``reads`` table at close
        # (the fleet-at-rest bench's BMC calls per node)
        self._reads: Counter[tuple[str, str]] = Counter()

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def get(self, key: str, attr: str) -> str:
        self._reads[(key, attr)] += 1
        return await self._run(lambda: self._get_blocking(key, attr))

    async def ensure(self, key: str, op: str, attr: str, value: str) -> bool:
        """Set ``attr`` to ``value`` in one transaction; count the call, and the effect if any."""
        return await self._run(lambda: self._ensure_blocking(key, op, attr, value))

    def ledger_blocking(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(machine, op) -> (calls, effects); for tests and the bench."""
        rows = self._db.execute("SELECT key, op, calls, effects FROM ledger").fetchall()
        return {(key, op): (calls, effects) for key, op, calls, effects in rows}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._reads:
            with self._db:  # idle: no transaction of ensure() is open
                self._db.executemany(
                    "INSERT INTO reads(key, attr, calls) VALUES (?, ?, ?) ON CONFLICT(key, attr) "
                    "DO UPDATE SET calls=calls+excluded.calls",
                    [(key, attr, n) for (key, attr), n in self._reads.items()])
            self._reads.clear()
        self._db.close()

    def _get_blocking(self, key: str, attr: str) -> str:
        row = self._db.execute(
            "SELECT value FROM machine WHERE key=? AND attr=?", (key, attr)
        ).fetchone()
        return str(row[0]) if row else DEFAULTS.get(attr, "")

    def _ensure_blocking(self, key: str, op: str, attr: str, value: str) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                changed = self._get_blocking(key, attr) != value
                if changed:
                    self._db.execute(
                        "INSERT INTO machine(key, attr, value) VALUES (?, ?, ?) "
                        "ON CONFLICT(key, attr) DO UPDATE SET value=excluded.value",
                        (key, attr, value),
                    )
                self._db.execute(
                    "INSERT INTO ledger(key, op, calls, effects) VALUES (?, ?, 1, ?) "
                    "ON CONFLICT(key, op) DO UPDATE SET calls=calls+1, effects=effects+?",
                    (key, op, int(changed), int(changed)),
                )
                self._db.execute("COMMIT")
            except BaseException as exc:
                # SQLite may have rolled the transaction back itself (SQLITE_FULL, IOERR):
                # a second ROLLBACK would raise and hide why the write failed
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    # the simulated machines' records cannot be written (a full disk, a
                    # locked file): like the store's, the step stops and resumes later
                    raise StoreUnavailable(f"simulated hardware state: {exc}") from exc
                raise
            return changed


def read_ledger(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """Read a world's ledger from another process (the crash test)."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT key, op, calls, effects FROM ledger").fetchall()
    return {(key, op): (calls, effects) for key, op, calls, effects in rows}
