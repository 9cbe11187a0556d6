"""Cross-daemon cache invalidation on PostgreSQL (``LISTEN/NOTIFY``, DESIGN §7).

Every node write sends ``NOTIFY provisioner_nodes`` in its own transaction (delivered at
commit, dropped on rollback) with ``instance|node id|mac,mac``; each daemon listens on one
connection of its own, in a thread, and hands other daemons' notices to its callbacks on the
event loop, so the MAC cache and the negative discovery cache drop a node at once instead of
after their TTL."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text
from sqlmodel import Session

log = logging.getLogger(__name__)

CHANNEL = "provisioner_nodes"


@dataclass(frozen=True, slots=True)
class NodeChanged:
    instance: str
    node_id: str
    macs: tuple[str, ...]


def send(s: Session | Connection, instance: str | None, node_id: str,
         macs: Sequence[str]) -> None:
    """In the writer's transaction; PostgreSQL only (SQLite has one daemon)."""
    dialect = s.dialect if isinstance(s, Connection) else s.get_bind().dialect
    if dialect.name != "postgresql":
        return
    payload = f"{instance or ''}|{node_id}|{','.join(macs)}"[:7900]
    s.execute(text("SELECT pg_notify(:channel, :payload)"),
              {"channel": CHANNEL, "payload": payload})


def parse(payload: str) -> NodeChanged | None:
    parts = payload.split("|")
    if len(parts) != 3 or not parts[1]:
        return None
    return NodeChanged(parts[0], parts[1], tuple(m for m in parts[2].split(",") if m))


class Listener:
    """A thread on its own connection: ``LISTEN``, then each notice from another instance
    goes to ``callback`` on ``loop``. Reconnects after a lost connection (a restarted
    PostgreSQL); ``on_reconnect`` then runs too (notices were missed: drop every cache)."""

    def __init__(self, conninfo: str, instance: str, loop: asyncio.AbstractEventLoop,
                 callback: Callable[[NodeChanged], None],
                 on_reconnect: Callable[[], None]) -> None:
        self._conninfo = conninfo
        self._instance = instance
        self._loop = loop
        self._callback = callback
        self._on_reconnect = on_reconnect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg  # only with PostgreSQL (the "postgres" extra)

        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if not first:
                        self._loop.call_soon_threadsafe(self._on_reconnect)
                    first = False
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self._deliver(notice.payload)
            except psycopg.Error as exc:
                log.warning("cache invalidation: listen connection lost (%s); reconnecting",
                            type(exc).__name__)
                self._stop.wait(1.0)

    def _deliver(self, payload: str) -> None:
        changed = parse(payload)
        if changed is None or changed.instance == self._instance:
            return  # our own writes: the conductor's observers saw them already
        try:
            self._loop.call_soon_threadsafe(self._callback, changed)
        except RuntimeError:  # the loop closed: we are stopping
            self._stop.set()
