"""MacLookup: which node owns a MAC, for the boot servers' hot path, as one read per burst.

In a boot storm every new client's DISCOVER asks "whose MAC is this?", mostly of MACs the
store has never seen. Asked one by one through the ORM (``NodeRepo.find``: three look-ups
in a session of its own), that question took more of the store's one SQLite thread than
the leases themselves (profiled: 58 % of the store thread at 1,000 DORA/s). Here the MACs
asked while a read is running wait for the next one, and each read answers all of them
with one driver-SQL statement (``IN`` of up to ``CHUNK`` MACs).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import Engine

CHUNK = 500  # MACs per statement (SQLite allows 32,766 parameters; PostgreSQL 65,535)


@dataclass(frozen=True, slots=True)
class MacOwner:
    mac: str
    node_id: str
    hostname: str | None
    state: str


class MacLookup:
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor) -> None:
        self._engine = engine
        self._pool = pool
        self._m = "?" if engine.dialect.name == "sqlite" else "%s"
        self._waiting: dict[str, list[asyncio.Future[MacOwner | None]]] = {}
        self._lock = threading.Lock()
        self._reading = False

    async def owner(self, mac: str) -> MacOwner | None:
        """The node that owns ``mac`` (normalised, lower case), or None."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[MacOwner | None] = loop.create_future()
        with self._lock:
            self._waiting.setdefault(mac, []).append(future)
            start = not self._reading
            self._reading = True
        if start:
            loop.run_in_executor(self._pool, self._drain_blocking, loop)
        return await future

    def _drain_blocking(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._lock:
                waiting, self._waiting = self._waiting, {}
                if not waiting:
                    self._reading = False
                    return
            try:
                found, error = self._read_blocking(list(waiting)), None
            except Exception as exc:  # the store is away: every waiter hears why
                found, error = {}, exc
            try:
                loop.call_soon_threadsafe(_settle, waiting, found, error)
            except RuntimeError:  # the loop closed while we read: nobody is waiting
                return

    def _read_blocking(self, macs: list[str]) -> dict[str, MacOwner]:
        found: dict[str, MacOwner] = {}
        with self._engine.connect() as conn:
            for i in range(0, len(macs), CHUNK):
                chunk = macs[i:i + CHUNK]
                rows = conn.exec_driver_sql(
                    "SELECT m.mac, n.id, n.hostname, n.state FROM node_mac m "
                    "JOIN node n ON n.id = m.node_id "
                    f"WHERE m.mac IN ({', '.join([self._m] * len(chunk))})", tuple(chunk))
                for mac, node_id, hostname, state in rows:
                    found[mac] = MacOwner(mac, node_id, hostname, state)
            conn.rollback()  # read only: nothing to commit
        return found


def _settle(waiting: dict[str, list[asyncio.Future[MacOwner | None]]],
            found: dict[str, MacOwner], error: BaseException | None) -> None:
    for mac, futures in waiting.items():
        for future in futures:
            if future.done():  # the caller was cancelled meanwhile
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(found.get(mac))
