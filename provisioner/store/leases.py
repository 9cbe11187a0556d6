"""LeaseRepo: DHCP leases of the authoritative mode, in the ``lease`` table.

One row per MAC (the primary key) and per address (unique). An OFFER writes nothing: the
address is held in memory (``store/lease_offers.py``) until the REQUEST binds it, which is
the one write a new client costs; a renewal within ``cache_threshold`` of the lease time
since its last write is answered from the row as it is (Kea's lease caching). A MAC keeps
its row after it released or let its lease expire, so it gets the same address back
("sticky") until the pool runs out of never-used addresses and reclaims the oldest expired
one. A row with a
``node_id`` is a reservation: it belongs to a known node and is never reclaimed. A declined
address is parked under the key ``declined:<hex ip>`` until ``expires_at``.

Every method runs in the bounded store pool, in one transaction with the others waiting at
that moment (group commit, ``store/batch.py``). Two daemons on PostgreSQL racing to bind one
address meet the unique constraint; the loser's client is NAKed and starts over, so an
address is never bound to two MACs.

A MAC bound at one address may move to another only where this repository made that
binding itself: a row another daemon bound a moment ago (two servers answering one segment,
each having offered the client its own address) may be an address the other server just
acknowledged, and moving the row would free it for someone else. Such a REQUEST is NAKed;
the client's next DISCOVER is offered the address it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection, Engine, Table, delete, select, update
from sqlalchemy.exc import IntegrityError

from provisioner.errors import ConfigError
from provisioner.store.batch import TxnBatcher
from provisioner.store.lease_offers import OfferBook
from provisioner.store.models import LeaseRow

T = TypeVar("T")
_LEASE: Table = LeaseRow.__table__  # type: ignore[attr-defined]
_C = _LEASE.c
_DECLINED_PREFIX = "declined:"
_LAPSED_BATCH = 32  # lapsed rows looked at per offer, oldest first
_MAX_OWN_BINDS = 65_536  # MACs whose binding this repository remembers making (oldest
# forgotten first: a forgotten MAC's move is NAKed, which is safe)


class LeaseState(StrEnum):
    OFFERED = "offered"
    BOUND = "bound"
    RELEASED = "released"
    EXPIRED = "expired"
    DECLINED = "declined"


@dataclass(frozen=True, slots=True)
class Lease:
    mac: str
    ip: IPv4Address
    state: LeaseState
    expires_at: datetime
    node_id: str | None = None
    hostname: str | None = None
    client_id: str | None = None

    @property
    def reserved(self) -> bool:
        return self.node_id is not None


@dataclass(frozen=True, slots=True)
class AddressRange:
    """The dynamic pool ``FIRST-LAST`` inside the subnet given by ``netmask``."""

    first: IPv4Address
    last: IPv4Address
    network: IPv4Network

    @classmethod
    def parse(cls, pool: str, netmask: str) -> AddressRange:
        first_text, sep, last_text = pool.partition("-")
        try:
            first, last = IPv4Address(first_text.strip()), IPv4Address(last_text.strip())
            network = IPv4Network(f"{first}/{netmask}", strict=False)
        except ValueError as exc:
            raise ConfigError(f"dhcp.pool {pool!r} / netmask {netmask!r}: {exc}") from None
        if not sep or last < first or last not in network:
            raise ConfigError(f"dhcp.pool {pool!r}: expected FIRST-LAST in one subnet "
                              f"of netmask {netmask}")
        return cls(first, last, network)

    def __contains__(self, ip: object) -> bool:
        return isinstance(ip, IPv4Address) and self.first <= ip <= self.last

    def __len__(self) -> int:
        return int(self.last) - int(self.first) + 1

    def __iter__(self) -> Iterator[IPv4Address]:
        return (IPv4Address(n) for n in range(int(self.first), int(self.last) + 1))


@dataclass(frozen=True, slots=True)
class Holder:
    """Who asks for an address: known nodes' leases are reservations."""

    mac: str
    node_id: str | None = None
    hostname: str | None = None
    client_id: str | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaseRepo:
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, *,
                 clock: Callable[[], datetime] = _utcnow, cache_threshold: float = 0.0) -> None:
        self._engine = engine
        self._pool = pool
        self._clock = clock
        self._cache_threshold = cache_threshold
        self._offers = OfferBook()
        # MAC -> (address, write time) of the binding this repository last wrote
        self._own_binds: dict[str, tuple[IPv4Address, datetime]] = {}
        self._cursor: dict[IPv4Address, int] = {}  # per pool: where the next scan starts
        self._sql = _Sql(engine)
        self._batch = TxnBatcher(engine, pool, clock)

    async def _run(self, fn: Callable[[Connection, datetime], T]) -> T:
        return await self._batch.run(fn)

    # -- reads ------------------------------------------------------------------------------

    async def get(self, mac: str) -> Lease | None:
        return await self._run(lambda c, _now: _lease(self._sql.by_mac(c, mac)))

    async def leased_address(self, mac: str) -> str | None:
        """The address this server last bound for ``mac`` (an agent token is bound to it)."""
        lease = await self.get(mac)
        return str(lease.ip) if lease is not None else None

    async def all(self) -> list[Lease]:
        def work(conn: Connection, _now: datetime) -> list[Lease]:
            return [lease for row in self._sql.all(conn) if (lease := _lease(row)) is not None]

        return await self._run(work)

    # -- the DHCP verbs -----------------------------------------------------------------------

    async def offer(self, holder: Holder, addresses: AddressRange, *, hold_s: float,
                    requested: IPv4Address | None = None) -> Lease | None:
        """An address for DISCOVER: the MAC's own (sticky), else ``requested`` if free, else
        the next free one. Held as ``offered`` for ``hold_s`` in memory, not in the store (a
        MAC whose lease is still bound gets it back as ``bound``); None when the pool is
        full."""
        return await self._run(lambda c, now: self._offer(
            c, now, holder, addresses, requested, hold_s))

    async def bind(self, holder: Holder, ip: IPv4Address, addresses: AddressRange, *,
                   lease_time_s: float) -> Lease | None:
        """REQUEST (selecting, init-reboot, renewing, rebinding) for ``ip``: bound, or None
        when the address is not this MAC's to have (the server answers NAK)."""
        def work(conn: Connection, now: datetime) -> Lease | None:
            own = self._sql.by_mac_locked(conn, holder.mac)
            if own is not None and IPv4Address(own.ip) == ip:
                self._offers.drop(holder.mac)
                node_id = holder.node_id or own.node_id
                if self._unchanged(own, holder, node_id, now, lease_time_s):
                    return _lease(own)  # a renewal that changes nothing writes nothing
                return self._remember(self._sql.write(
                    conn, now, holder, ip, LeaseState.BOUND, lease_time_s, node_id=node_id,
                    new=False), now)
            if ip not in addresses or (own is not None and own.node_id is not None):
                return None  # not ours to give, or this node's reservation is elsewhere
            if self._offers.held_by_other(ip, holder.mac, now):
                return None  # offered to another client a moment ago
            if own is not None and self._bound_elsewhere(own, now):
                self._offers.drop(holder.mac)
                return None  # bound at another address by another server: not ours to free
            lease = self._bind_free(conn, now, holder, own, addresses, ip, lease_time_s)
            if lease is None:  # NAK: the client starts over, with another offer
                self._offers.drop(holder.mac)
            return self._remember(lease, now)

        try:
            return await self._run(work)
        except IntegrityError:  # another daemon bound the address (or the MAC) first
            await self.forget_offer(holder.mac)
            return None

    def _bound_elsewhere(self, own: _LeaseRow, now: datetime) -> bool:
        """Is the MAC's row a live binding other than the one this repository last wrote
        (another daemon's, a renewal through another daemon, or one from before this daemon
        started)?"""
        return (own.state == LeaseState.BOUND and _aware(own.expires_at) > now
                and self._own_binds.get(str(own.mac))
                != (IPv4Address(own.ip), _aware(own.updated_at)))

    def _remember(self, lease: Lease | None, now: datetime) -> Lease | None:
        """Note a binding this repository wrote (the MAC may later move from it)."""
        if lease is not None:
            self._own_binds.pop(lease.mac, None)
            if len(self._own_binds) >= _MAX_OWN_BINDS:
                del self._own_binds[next(iter(self._own_binds))]
            self._own_binds[lease.mac] = (lease.ip, now)
        return lease

    async def renew(self, holder: Holder, ip: IPv4Address, addresses: AddressRange, *,
                    lease_time_s: float) -> Lease | None:
        """A bound client extends its lease (RENEWING/REBINDING); same rules as ``bind``."""
        return await self.bind(holder, ip, addresses, lease_time_s=lease_time_s)

    def seconds_left(self, lease: Lease) -> int:
        """Whole seconds until ``lease`` expires (at least 1), by this repository's clock."""
        return max(1, round((lease.expires_at - self._clock()).total_seconds()))

    async def forget_offer(self, mac: str) -> None:
        """The client took another server's offer: its address is free again here."""
        def work(_conn: Connection, _now: datetime) -> None:
            self._offers.drop(mac)

        await self._run(work)

    def _unchanged(self, own: _LeaseRow, holder: Holder, node_id: str | None,
                   now: datetime, lease_time_s: float) -> bool:
        """A bound, unexpired row with the same holder, written less than
        ``cache_threshold`` of a lease time ago (and never past its own lease time)."""
        if (own.state != LeaseState.BOUND or own.node_id != node_id
                or own.hostname != holder.hostname or own.client_id != holder.client_id):
            return False
        written, expires = _aware(own.updated_at), _aware(own.expires_at)
        return (expires > now and expires - written <= timedelta(seconds=lease_time_s)
                and now - written < timedelta(seconds=self._cache_threshold * lease_time_s))

    async def release(self, mac: str, ip: IPv4Address) -> bool:
        """RELEASE: the address goes back to the pool but stays this MAC's first choice."""
        def work(conn: Connection, now: datetime) -> bool:
            self._offers.drop(mac)
            result = conn.execute(update(_LEASE).where(_C.mac == mac, _C.ip == str(ip))
                                  .values(state=LeaseState.RELEASED, expires_at=now,
                                          updated_at=now))
            return bool(result.rowcount)

        return await self._run(work)

    async def decline(self, mac: str, ip: IPv4Address, *, hold_s: float) -> bool:
        """DECLINE (the client found the address in use): park it for ``hold_s``; the MAC
        gets another address next time."""
        def work(conn: Connection, now: datetime) -> bool:
            self._offers.drop(mac)
            result = conn.execute(
                update(_LEASE).where(_C.mac == mac, _C.ip == str(ip))
                .values(mac=_declined_key(ip), state=LeaseState.DECLINED, node_id=None,
                        hostname=None, client_id=None,
                        expires_at=now + timedelta(seconds=hold_s), updated_at=now))
            return bool(result.rowcount)

        return await self._run(work)

    async def expire(self) -> int:
        """Mark lapsed leases expired and free declined addresses whose hold is over;
        return how many rows changed."""
        def work(conn: Connection, now: datetime) -> int:
            freed = conn.execute(delete(_LEASE).where(_C.state == LeaseState.DECLINED,
                                                      _C.expires_at <= now)).rowcount
            lapsed = conn.execute(
                update(_LEASE).where(_C.state.in_([LeaseState.OFFERED, LeaseState.BOUND]),
                                     _C.expires_at <= now)
                .values(state=LeaseState.EXPIRED, updated_at=now)).rowcount
            return int(freed) + int(lapsed) + self._offers.expire(now)

        return await self._run(work)

    # -- allocation (runs in the pool) ---------------------------------------------------------

    def _offer(self, conn: Connection, now: datetime, holder: Holder,
               addresses: AddressRange, requested: IPv4Address | None,
               hold_s: float) -> Lease | None:
        until = now + timedelta(seconds=hold_s)
        own = self._sql.by_mac(conn, holder.mac)
        if own is not None:
            ip = IPv4Address(own.ip)
            if ip in addresses or own.node_id is not None:
                if own.state == LeaseState.BOUND and _aware(own.expires_at) > now:
                    self._offers.drop(holder.mac)
                    return _lease(own)  # still bound: the same lease again
                if not self._offers.held_by_other(ip, holder.mac, now):
                    return self._promise(holder, ip, until, now,
                                         node_id=holder.node_id or own.node_id)
            else:
                conn.execute(delete(_LEASE).where(_C.mac == holder.mac))  # pool moved away
        promised = self._offers.of(holder.mac, now)
        if promised is not None and promised in addresses and self._free(conn, promised, now):
            return self._promise(holder, promised, until, now, node_id=holder.node_id)
        for ip, _occupied in self._candidates(conn, now, addresses, requested, False):
            if not self._offers.held_by_other(ip, holder.mac, now):
                return self._promise(holder, ip, until, now, node_id=holder.node_id)
        return None

    def _free(self, conn: Connection, ip: IPv4Address, now: datetime) -> bool:
        return _reusable(self._sql.by_ip(conn, ip), now)

    def _promise(self, holder: Holder, ip: IPv4Address, until: datetime, now: datetime, *,
                 node_id: str | None) -> Lease | None:
        if not self._offers.hold(holder.mac, ip, until, now):
            return None
        return Lease(mac=holder.mac, ip=ip, state=LeaseState.OFFERED, expires_at=until,
                     node_id=node_id, hostname=holder.hostname, client_id=holder.client_id)

    def _bind_free(self, conn: Connection, now: datetime, holder: Holder, own: _LeaseRow | None,
                   addresses: AddressRange, ip: IPv4Address, lease_time_s: float) -> Lease | None:
        """Bind ``ip``, free or lapsed, to a MAC whose row (if any) holds another address.
        Another daemon binding it at the same moment makes the insert raise IntegrityError
        (``bind`` answers NAK); no savepoint per bind: it cost a third of a bind."""
        for candidate, occupied in self._candidates(conn, now, addresses, ip, True):
            if occupied:  # a lapsed lease of another MAC: reclaim it
                self._sql.reclaim(conn, candidate, holder.mac, now)
            lease = self._sql.write(conn, now, holder, candidate, LeaseState.BOUND,
                                    lease_time_s, node_id=holder.node_id, new=own is None)
            if lease is not None:  # (None: another server reclaimed our own row meanwhile)
                self._offers.drop(holder.mac)
            return lease
        return None

    def _candidates(self, conn: Connection, now: datetime, addresses: AddressRange,
                    requested: IPv4Address | None,
                    only_requested: bool) -> Iterator[tuple[IPv4Address, bool]]:
        """Addresses to try, lazily, with whether a (lapsed) row holds them now."""
        if requested is not None and requested in addresses:
            row = self._sql.by_ip(conn, requested)
            if _reusable(row, now):
                yield requested, row is not None
        if only_requested:
            return
        yield from ((ip, False) for ip in self._scan(conn, addresses))
        rows = conn.execute(select(_C.ip).where(_C.node_id.is_(None), _C.expires_at <= now)
                            .order_by(_C.expires_at).limit(_LAPSED_BATCH)).all()
        yield from ((ip, True) for row in rows if (ip := IPv4Address(row.ip)) in addresses)

    def _scan(self, conn: Connection, addresses: AddressRange) -> Iterator[IPv4Address]:
        """Never-used addresses: a cursor walks the pool once (one indexed look-up per
        address); past its end, holes are found with one query over all rows."""
        first, last = int(addresses.first), int(addresses.last)
        n = self._cursor.get(addresses.first, first)
        while n <= last:
            ip = IPv4Address(n)
            n += 1
            self._cursor[addresses.first] = n
            if self._sql.by_ip(conn, ip) is None:
                yield ip
        used = {row.ip for row in conn.execute(select(_C.ip))}
        yield from (ip for ip in addresses if str(ip) not in used)


class _LeaseRow(NamedTuple):
    """A ``lease`` row as the driver returns it (SQLite: timestamps as text)."""

    mac: str
    ip: str
    state: str
    node_id: str | None
    expires_at: object
    updated_at: object
    hostname: str | None
    client_id: str | None


class _IpRow(NamedTuple):
    mac: str
    node_id: str | None
    expires_at: object


class _Sql:
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

    def by_mac(self, conn: Connection, mac: str) -> _LeaseRow | None:
        row = self._one(conn, self._by_mac, (mac,))
        return None if row is None else _LeaseRow(*row)

    def by_mac_locked(self, conn: Connection, mac: str) -> _LeaseRow | None:
        row = self._one(conn, self._by_mac_locked, (mac,))
        return None if row is None else _LeaseRow(*row)

    def by_ip(self, conn: Connection, ip: IPv4Address) -> _IpRow | None:
        row = self._one(conn, self._by_ip, (str(ip),))
        return None if row is None else _IpRow(*row)

    def all(self, conn: Connection) -> list[_LeaseRow]:
        return [_LeaseRow(*row) for row in self._cursor(conn, self._all, ()).fetchall()]

    def reclaim(self, conn: Connection, ip: IPv4Address, mac: str, now: datetime) -> None:
        self._changed(conn, self._reclaim, (str(ip), mac, self._ts(now)))

    def write(self, conn: Connection, now: datetime, holder: Holder, ip: IPv4Address,
              state: LeaseState, duration_s: float, *, node_id: str | None,
              new: bool) -> Lease | None:
        """Insert the MAC's row, or update it: None when it is gone (another server
        reclaimed its lapsed address since we read it; the address is no longer ours)."""
        expires_at = now + timedelta(seconds=duration_s)
        values = (str(ip), str(state), node_id, self._ts(expires_at), self._ts(now),
                  holder.hostname, holder.client_id)
        if new:
            self._changed(conn, self._insert, (holder.mac, *values))
        elif self._changed(conn, self._update, (*values, holder.mac)) == 0:
            return None
        return Lease(mac=holder.mac, ip=ip, state=state, expires_at=expires_at,
                     node_id=node_id, hostname=holder.hostname, client_id=holder.client_id)


def _reusable(row: _IpRow | None, now: datetime) -> bool:
    """An address is free when no row holds it, or only a lapsed lease that is no
    reservation (a known node's address is never handed to another MAC)."""
    return row is None or (row.node_id is None and _aware(row.expires_at) <= now)


def _lease(row: _LeaseRow | None) -> Lease | None:
    if row is None:
        return None
    return Lease(mac=row.mac, ip=IPv4Address(row.ip), state=LeaseState(row.state),
                 expires_at=_aware(row.expires_at), node_id=row.node_id,
                 hostname=row.hostname, client_id=row.client_id)


def _aware(moment: object) -> datetime:
    if isinstance(moment, str):  # SQLite through driver SQL
        moment = datetime.fromisoformat(moment)
    assert isinstance(moment, datetime)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _declined_key(ip: IPv4Address) -> str:
    return f"{_DECLINED_PREFIX}{int(ip):08x}"
