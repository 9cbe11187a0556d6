"""The lease table's hot statements (every DISCOVER and REQUEST), as driver SQL, for
``store/leases.py``: rows as the driver returns them, and the timestamps as SQLAlchemy
stores them."""

from __future__ import annotations

from datetime import UTC, datetime
from ipaddress import IPv4Address
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError


class LeaseRecord(NamedTuple):
    """A ``lease`` row as the driver returns it (SQLite: timestamps as text)."""

    mac: str
    ip: str
    state: str
    node_id: str | None
    expires_at: object
    updated_at: object
    hostname: str | None
    client_id: str | None


class AddressRecord(NamedTuple):
    mac: str
    node_id: str | None
    expires_at: object


class LeaseSql:
    """The hot statements (every DISCOVER and REQUEST) as driver SQL, run by the driver
    connection's own ``execute`` in the transaction the Connection began: compiled Core
    statements cost four times as much here, and ``exec_driver_sql``'s result objects took
    a quarter of the store threads' time in a storm (docs/performance.md, DHCP).
    Timestamps as SQLAlchemy stores them."""

    _COLUMNS = "mac, ip, state, node_id, expires_at, updated_at, hostname, client_id"

    def __init__(self, engine: Engine) -> None:
        self._sqlite = engine.dialect.name == "sqlite"
        # the driver's own (PEP 249) error, raised as SQLAlchemy's, as Core would
        self._integrity_error: type[Exception] = engine.dialect.loaded_dbapi.IntegrityError
        m = "?" if self._sqlite else "%s"
        self._by_mac = f"SELECT {self._COLUMNS} FROM lease WHERE mac = {m}"
        # a writer reads the MAC's row locked: two servers answering one client at once
        # (one binds, one offers) never overwrite each other's newer row (PostgreSQL;
        # SQLite has one writer at a time)
        self._by_mac_locked = self._by_mac + ("" if self._sqlite else " FOR UPDATE")
        self._by_ip = f"SELECT mac, node_id, expires_at FROM lease WHERE ip = {m}"
        self._all = f"SELECT {self._COLUMNS} FROM lease ORDER BY ip"
        self._insert = f"INSERT INTO lease ({self._COLUMNS}) VALUES ({', '.join([m] * 8)})"
        self._update = (f"UPDATE lease SET ip = {m}, state = {m}, node_id = {m}, "
                        f"expires_at = {m}, updated_at = {m}, hostname = {m}, client_id = {m} "
                        f"WHERE mac = {m}")
        self._reclaim = (f"DELETE FROM lease WHERE ip = {m} AND mac <> {m} "
                         f"AND node_id IS NULL AND expires_at <= {m}")

    def _ts(self, moment: datetime) -> object:
        if self._sqlite:  # SQLAlchemy's SQLite DateTime: naive UTC text
            # (the text of strftime("%Y-%m-%d %H:%M:%S.%f"), at two thirds of its cost)
            return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
        return moment

    def _cursor(self, conn: Connection, sql: str, params: tuple[object, ...]) -> Any:
        """``execute`` of the driver's connection (sqlite3 and psycopg both have it): a
        new cursor, closed when dropped."""
        try:
            return conn.connection.dbapi_connection.execute(sql, params)  # type: ignore[union-attr]
        except self._integrity_error as exc:  # another daemon bound it first
            raise IntegrityError(sql, params, exc) from exc

    def _one(self, conn: Connection, sql: str, params: tuple[object, ...]) -> Any:
        return self._cursor(conn, sql, params).fetchone()

    def _changed(self, conn: Connection, sql: str, params: tuple[object, ...]) -> int:
        return int(self._cursor(conn, sql, params).rowcount)

    def by_mac(self, conn: Connection, mac: str) -> LeaseRecord | None:
        row = self._one(conn, self._by_mac, (mac,))
        return None if row is None else LeaseRecord(*row)

    def by_mac_locked(self, conn: Connection, mac: str) -> LeaseRecord | None:
        row = self._one(conn, self._by_mac_locked, (mac,))
        return None if row is None else LeaseRecord(*row)

    def by_ip(self, conn: Connection, ip: IPv4Address) -> AddressRecord | None:
        row = self._one(conn, self._by_ip, (str(ip),))
        return None if row is None else AddressRecord(*row)

    def all(self, conn: Connection) -> list[LeaseRecord]:
        return [LeaseRecord(*row) for row in self._cursor(conn, self._all, ()).fetchall()]

    def reclaim(self, conn: Connection, ip: IPv4Address, mac: str, now: datetime) -> None:
        self._changed(conn, self._reclaim, (str(ip), mac, self._ts(now)))

    def write(self, conn: Connection, row: LeaseRecord, *, new: bool) -> bool:
        """Insert the MAC's row, or update it: False when it is gone (another server
        reclaimed its lapsed address since we read it; the address is no longer ours)."""
        values = (row.ip, str(row.state), row.node_id, self._ts(aware(row.expires_at)),
                  self._ts(aware(row.updated_at)), row.hostname, row.client_id)
        if new:
            self._changed(conn, self._insert, (row.mac, *values))
            return True
        return self._changed(conn, self._update, (*values, row.mac)) > 0


def reusable(row: AddressRecord | None, now: datetime) -> bool:
    """An address is free when no row holds it, or only a lapsed lease that is no
    reservation (a known node's address is never handed to another MAC)."""
    return row is None or (row.node_id is None and aware(row.expires_at) <= now)


def aware(moment: object) -> datetime:
    """A timestamp as the driver returns it (SQLite: naive UTC text), as an aware datetime."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    assert isinstance(moment, datetime)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
