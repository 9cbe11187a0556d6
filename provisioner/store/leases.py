"""LeaseRepo: DHCP leases of the authoritative mode, in the ``lease`` table.

One row per MAC (the primary key) and per address (unique). An OFFER writes nothing: the
address is held in memory (``store/lease_offers.py``) until the REQUEST binds it, which is
the one write a new client costs; a renewal within ``cache_threshold`` of the lease time
since its last write is answered from the row as it is (Kea's lease caching). A MAC keeps
its row after it released or let its lease expire, so it gets the same address back
("sticky") until the pool runs out of never-used addresses and reclaims the oldest expired
one. A row with a
``node_id`` is a reservation: it belongs to a known node and is never reclaimed. A declined
dynamic address is parked under the key ``declined:<hex ip>`` until ``expires_at``; a
DECLINE never touches a reservation (``decline``).

Every method runs in the bounded store pool, in one transaction with the others waiting at
that moment (group commit, ``store/batch.py``); the hot statements are driver SQL
(``store/lease_sql.py``). Two daemons on PostgreSQL racing to bind one
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
from itertools import chain
from typing import TypeVar

from sqlalchemy import Connection, Engine, Table, delete, select, update
from sqlalchemy.exc import IntegrityError

from provisioner.errors import ConfigError
from provisioner.store.batch import TxnBatcher
from provisioner.store.lease_offers import OfferBook
from provisioner.store.lease_sql import LeaseRecord, LeaseSql, aware, reusable
from provisioner.store.models import LeaseRow

T = TypeVar("T")
_LEASE: Table = LeaseRow.__table__  # type: ignore[attr-defined]
_C = _LEASE.c
_DECLINED_PREFIX = "declined:"
_LAPSED_BATCH = 32  # lapsed rows looked at per offer, oldest first
_MAX_OWN_BINDS = 65_536  # MACs whose binding this repository remembers making (oldest
# forgotten first: a forgotten MAC's move is NAKed, which is safe)


class DeclineOutcome(StrEnum):
    DECLINED = "declined"  # a dynamic address parked
    RESERVED = "reserved"  # a known node's reservation: kept
    NOT_ITS_LEASE = "not its lease"  # no live binding of that address to that client


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

    def part(self, slot: int, count: int) -> AddressRange:
        """The ``slot``-th of ``count`` contiguous parts (they cover the range, sizes
        differing by one at most; a part is never empty: ``count`` <= ``len(self)``)."""
        if not 0 <= slot < count <= len(self):
            raise ConfigError(f"dhcp.pool {self.first}-{self.last}: cannot be cut into "
                              f"{count} parts")
        size, extra = divmod(len(self), count)
        start = int(self.first) + slot * size + min(slot, extra)
        end = start + size + (1 if slot < extra else 0) - 1
        return AddressRange(IPv4Address(start), IPv4Address(end), self.network)


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
        self._sql = LeaseSql(engine)
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
                    requested: IPv4Address | None = None,
                    fresh: AddressRange | None = None) -> Lease | None:
        """An address for DISCOVER: the MAC's own (sticky), else ``requested`` if free, else
        the next free one. Held as ``offered`` for ``hold_s`` in memory, not in the store (a
        MAC whose lease is still bound gets it back as ``bound``); None when the pool is
        full. ``fresh``: the part of ``addresses`` this repository hands new clients from
        (a DHCP worker process's slice: two workers' offers, each in its own memory, never
        name one address), ``requested`` included; only once it is all taken, a lapsed
        lease anywhere in ``addresses`` (two workers may then offer one: the first REQUEST
        binds it, the other is NAKed)."""
        return await self._run(lambda c, now: self._offer(
            c, now, holder, addresses, requested, hold_s, fresh or addresses))

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
                return self._remember(self._write(
                    conn, now, holder, ip, lease_time_s, node_id=node_id, new=False), now)
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

    def _bound_elsewhere(self, own: LeaseRecord, now: datetime) -> bool:
        """Is the MAC's row a live binding other than the one this repository last wrote
        (another daemon's, a renewal through another daemon, or one from before this daemon
        started)?"""
        return (own.state == LeaseState.BOUND and aware(own.expires_at) > now
                and self._own_binds.get(str(own.mac))
                != (IPv4Address(own.ip), aware(own.updated_at)))

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

    def _unchanged(self, own: LeaseRecord, holder: Holder, node_id: str | None,
                   now: datetime, lease_time_s: float) -> bool:
        """A bound, unexpired row with the same holder, written less than
        ``cache_threshold`` of a lease time ago (and never past its own lease time)."""
        if (own.state != LeaseState.BOUND or own.node_id != node_id
                or own.hostname != holder.hostname or own.client_id != holder.client_id):
            return False
        written, expires = aware(own.updated_at), aware(own.expires_at)
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

    async def decline(self, mac: str, ip: IPv4Address, *, hold_s: float,
                      client_id: str | None = None) -> DeclineOutcome:
        """DECLINE (the client found the address in use, RFC 2131 4.3.3): park a *dynamic*
        address for ``hold_s``; the MAC gets another one next time. Nothing in a DECLINE
        proves who sent it (a forged one names any MAC), so it is honoured only where losing
        the lease costs nobody an identity: the MAC's own live binding of ``ip`` (its client
        identifier, if it gave one, the same: Kea's rule), never a reservation of a known
        node (its lease is what its agent token is bound to)."""
        def work(conn: Connection, now: datetime) -> DeclineOutcome:
            own = self._sql.by_mac(conn, mac)
            if own is None or IPv4Address(own.ip) != ip:
                if self._offers.of(mac, now) == ip:
                    self._offers.drop(mac)  # an offered address: offered elsewhere next
                return DeclineOutcome.NOT_ITS_LEASE
            if own.node_id is not None:
                return DeclineOutcome.RESERVED
            if own.state != LeaseState.BOUND or (own.client_id is not None
                                                  and own.client_id != client_id):
                return DeclineOutcome.NOT_ITS_LEASE
            self._offers.drop(mac)
            result = conn.execute(
                update(_LEASE).where(_C.mac == mac, _C.ip == str(ip), _C.node_id.is_(None))
                .values(mac=_declined_key(ip), state=LeaseState.DECLINED, node_id=None,
                        hostname=None, client_id=None,
                        expires_at=now + timedelta(seconds=hold_s), updated_at=now))
            return DeclineOutcome.DECLINED if result.rowcount else DeclineOutcome.NOT_ITS_LEASE

        return await self._run(work)

    async def expire_offers(self) -> int:
        """Forget the offers whose hold ran out (what ``expire`` does in memory, for a
        repository whose store rows another one sweeps); return how many."""
        return await self._run(lambda _c, now: self._offers.expire(now))

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
               hold_s: float, fresh: AddressRange) -> Lease | None:
        until = now + timedelta(seconds=hold_s)
        own = self._sql.by_mac(conn, holder.mac)
        if own is not None:
            ip = IPv4Address(own.ip)
            if ip in addresses or own.node_id is not None:
                if own.state == LeaseState.BOUND and aware(own.expires_at) > now:
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
        candidates = self._candidates(conn, now, fresh, requested, False)
        if fresh != addresses:
            candidates = chain(candidates, self._lapsed(conn, now, addresses))
        for ip, _occupied in candidates:
            if not self._offers.held_by_other(ip, holder.mac, now):
                return self._promise(holder, ip, until, now, node_id=holder.node_id)
        return None

    def _free(self, conn: Connection, ip: IPv4Address, now: datetime) -> bool:
        return reusable(self._sql.by_ip(conn, ip), now)

    def _promise(self, holder: Holder, ip: IPv4Address, until: datetime, now: datetime, *,
                 node_id: str | None) -> Lease | None:
        if not self._offers.hold(holder.mac, ip, until, now):
            return None
        return Lease(mac=holder.mac, ip=ip, state=LeaseState.OFFERED, expires_at=until,
                     node_id=node_id, hostname=holder.hostname, client_id=holder.client_id)

    def _bind_free(self, conn: Connection, now: datetime, holder: Holder, own: LeaseRecord | None,
                   addresses: AddressRange, ip: IPv4Address, lease_time_s: float) -> Lease | None:
        """Bind ``ip``, free or lapsed, to a MAC whose row (if any) holds another address.
        Another daemon binding it at the same moment makes the insert raise IntegrityError
        (``bind`` answers NAK); no savepoint per bind: it cost a third of a bind."""
        for candidate, occupied in self._candidates(conn, now, addresses, ip, True):
            if occupied:  # a lapsed lease of another MAC: reclaim it
                self._sql.reclaim(conn, candidate, holder.mac, now)
            lease = self._write(conn, now, holder, candidate, lease_time_s,
                                node_id=holder.node_id, new=own is None)
            if lease is not None:  # (None: another server reclaimed our own row meanwhile)
                self._offers.drop(holder.mac)
            return lease
        return None

    def _write(self, conn: Connection, now: datetime, holder: Holder, ip: IPv4Address,
               lease_time_s: float, *, node_id: str | None, new: bool) -> Lease | None:
        """Bind ``ip`` in the MAC's row (inserted when ``new``): None when the row is gone
        (another server reclaimed its lapsed address since we read it)."""
        expires_at = now + timedelta(seconds=lease_time_s)
        if not self._sql.write(conn, LeaseRecord(
                holder.mac, str(ip), LeaseState.BOUND, node_id, expires_at, now,
                holder.hostname, holder.client_id), new=new):
            return None
        return Lease(mac=holder.mac, ip=ip, state=LeaseState.BOUND, expires_at=expires_at,
                     node_id=node_id, hostname=holder.hostname, client_id=holder.client_id)

    def _candidates(self, conn: Connection, now: datetime, addresses: AddressRange,
                    requested: IPv4Address | None,
                    only_requested: bool) -> Iterator[tuple[IPv4Address, bool]]:
        """Addresses to try, lazily, with whether a (lapsed) row holds them now."""
        if requested is not None and requested in addresses:
            row = self._sql.by_ip(conn, requested)
            if reusable(row, now):
                yield requested, row is not None
        if only_requested:
            return
        yield from ((ip, False) for ip in self._scan(conn, addresses))
        yield from self._lapsed(conn, now, addresses)

    @staticmethod
    def _lapsed(conn: Connection, now: datetime,
                addresses: AddressRange) -> Iterator[tuple[IPv4Address, bool]]:
        """The oldest lapsed dynamic leases in ``addresses``."""
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


def _lease(row: LeaseRecord | None) -> Lease | None:
    if row is None:
        return None
    return Lease(mac=row.mac, ip=IPv4Address(row.ip), state=LeaseState(row.state),
                 expires_at=aware(row.expires_at), node_id=row.node_id,
                 hostname=row.hostname, client_id=row.client_id)


def _declined_key(ip: IPv4Address) -> str:
    return f"{_DECLINED_PREFIX}{int(ip):08x}"
