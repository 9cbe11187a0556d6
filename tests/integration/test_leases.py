"""LeaseRepo against real SQLite and a real PostgreSQL server started by the test: sticky
addresses, reservations, NAK cases, release, decline, expiry, reclaim, and concurrent
requests that never share an address."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address

import pytest

from provisioner.domain import NewNode
from provisioner.errors import ConfigError
from provisioner.lifecycle.states import NodeState
from provisioner.store.leases import (
    AddressRange,
    DeclineOutcome,
    Holder,
    Lease,
    LeaseRepo,
    LeaseState,
)
from provisioner.store.store import Store

POOL = AddressRange.parse("10.77.0.100-10.77.0.109", "255.255.255.0")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def lease_store(any_store: Store) -> Store:
    return any_store


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def repo(lease_store: Store, clock: Clock) -> LeaseRepo:
    return LeaseRepo(lease_store.engine, lease_store.pool, clock=clock)


def mac(n: int) -> str:
    return f"52:54:00:00:01:{n:02x}"


def test_address_range_parsing() -> None:
    assert len(POOL) == 10 and IPv4Address("10.77.0.105") in POOL
    assert IPv4Address("10.77.0.110") not in POOL
    for bad in ("10.77.0.9", "10.77.0.20-10.77.0.10", "10.77.0.1-10.77.1.5", "x-y"):
        with pytest.raises(ConfigError):
            AddressRange.parse(bad, "255.255.255.0")


async def test_offer_bind_renew_release_is_sticky(repo: LeaseRepo, clock: Clock) -> None:
    holder = Holder(mac(1), client_id="01aabb")
    offered = await repo.offer(holder, POOL, hold_s=60)
    assert offered is not None and offered.state == LeaseState.OFFERED
    assert offered.ip == IPv4Address("10.77.0.100")
    bound = await repo.bind(holder, offered.ip, POOL, lease_time_s=600)
    assert bound is not None and bound.state == LeaseState.BOUND
    clock.advance(300)
    renewed = await repo.renew(holder, offered.ip, POOL, lease_time_s=600)
    assert renewed is not None and renewed.expires_at == clock.now + timedelta(seconds=600)
    assert await repo.release(holder.mac, offered.ip)
    assert (await repo.get(holder.mac)).state == LeaseState.RELEASED  # type: ignore[union-attr]
    assert (await repo.offer(Holder(mac(2)), POOL, hold_s=60)).ip != offered.ip  # type: ignore[union-attr]
    again = await repo.offer(holder, POOL, hold_s=60)
    assert again is not None and again.ip == offered.ip


def test_a_pool_is_cut_into_parts_that_cover_it() -> None:
    parts = [POOL.part(slot, 3) for slot in range(3)]
    assert [(str(p.first), str(p.last)) for p in parts] == [
        ("10.77.0.100", "10.77.0.103"), ("10.77.0.104", "10.77.0.106"),
        ("10.77.0.107", "10.77.0.109")]
    assert all(part.network == POOL.network for part in parts)
    with pytest.raises(ConfigError):
        POOL.part(0, 11)  # more parts than addresses


async def test_workers_offer_new_clients_only_from_their_own_part(
        lease_store: Store, clock: Clock) -> None:
    """Two DHCP worker processes (two repositories, each its offers in its own memory) on
    one store: new clients never get one address from both; an address another part holds
    stays bindable by the client that has it; once a part is full, a lapsed lease anywhere
    is offered, and the store decides which of two such offers binds."""
    a, b = (LeaseRepo(lease_store.engine, lease_store.pool, clock=clock) for _ in "ab")
    part_a, part_b = POOL.part(0, 2), POOL.part(1, 2)  # .100-.104, .105-.109
    offered = []
    for n in range(5):
        for repo, part, base in ((a, part_a, 0), (b, part_b, 16)):
            lease = await repo.offer(Holder(mac(base + n)), POOL, hold_s=60, fresh=part,
                                     requested=IPv4Address("10.77.0.107"))
            assert lease is not None and lease.ip in part, (n, lease)
            offered.append(lease.ip)
    assert len(set(offered)) == 10  # the requested .107 went to b's client only
    assert await a.offer(Holder(mac(40)), POOL, hold_s=60, fresh=part_a) is None
    # a REQUEST for an address the other worker offered (an INIT-REBOOT after a restart
    # with another count of workers, or a forged one): the store decides; the client of
    # the other worker's offer is then NAKed and starts over
    assert await a.bind(Holder(mac(41)), offered[9], POOL, lease_time_s=60) is not None
    assert await b.bind(Holder(mac(20)), offered[9], POOL, lease_time_s=60) is None
    for n in range(5):
        await a.bind(Holder(mac(n)), offered[2 * n], POOL, lease_time_s=30)
    for n in range(4):
        await b.bind(Holder(mac(16 + n)), offered[2 * n + 1], POOL,
                     lease_time_s=30 if n == 0 else 100)
    clock.advance(31)  # every lease of a's part and b's first have lapsed
    first = await a.offer(Holder(mac(50)), POOL, hold_s=60, fresh=part_a)
    second = await b.offer(Holder(mac(51)), POOL, hold_s=60, fresh=part_b)
    assert first is not None and second is not None
    assert second.ip == offered[1]  # b's own part first: its lapsed lease
    assert first.ip in part_a
    third = await b.offer(Holder(mac(52)), POOL, hold_s=60, fresh=part_b)
    assert third is not None and third.ip in part_a  # b's part full: a lapsed lease of a's
    bound = [await a.bind(Holder(mac(50)), first.ip, POOL, lease_time_s=60),
             await b.bind(Holder(mac(52)), third.ip, POOL, lease_time_s=60)]
    winners = [lease for lease in bound if lease is not None]
    assert len({lease.ip for lease in winners}) == len(winners)  # never one address twice
    table = await a.all()
    assert len({lease.ip for lease in table}) == len(table)


async def test_requested_address_and_naks(repo: LeaseRepo) -> None:
    wanted = IPv4Address("10.77.0.105")
    offered = await repo.offer(Holder(mac(1)), POOL, hold_s=60, requested=wanted)
    assert offered is not None and offered.ip == wanted
    # Another MAC cannot bind an address that is held; nor one outside the pool.
    assert await repo.bind(Holder(mac(2)), wanted, POOL, lease_time_s=60) is None
    assert await repo.bind(Holder(mac(2)), IPv4Address("10.77.0.200"), POOL,
                           lease_time_s=60) is None
    # INIT-REBOOT after the server lost the lease: a free address in the pool is granted.
    rebooted = await repo.bind(Holder(mac(3)), IPv4Address("10.77.0.107"), POOL,
                               lease_time_s=60)
    assert rebooted is not None and rebooted.state == LeaseState.BOUND
    # A MAC moving to another free address leaves its old one.
    moved = await repo.bind(Holder(mac(3)), IPv4Address("10.77.0.108"), POOL, lease_time_s=60)
    assert moved is not None
    assert [str(lease.ip) for lease in await repo.all()] == ["10.77.0.108"]  # offers: memory
    assert await repo.bind(Holder(mac(3)), wanted, POOL, lease_time_s=60) is None  # still held


async def test_a_mac_bound_by_another_server_is_not_moved(lease_store: Store, repo: LeaseRepo,
                                                           clock: Clock) -> None:
    """Two servers on one segment each offered the client its own address: the one that
    did not make the binding NAKs the move, which would free an acknowledged address."""
    other = LeaseRepo(lease_store.engine, lease_store.pool, clock=clock)  # a second daemon
    first, second = IPv4Address("10.77.0.101"), IPv4Address("10.77.0.102")
    assert await repo.bind(Holder(mac(4)), first, POOL, lease_time_s=60) is not None
    assert await other.bind(Holder(mac(4)), second, POOL, lease_time_s=60) is None
    assert str((await repo.get(mac(4))).ip) == str(first)  # type: ignore[union-attr]
    offered = await other.offer(Holder(mac(4)), POOL, hold_s=60)  # its next DISCOVER
    assert offered is not None and offered.ip == first and offered.state == LeaseState.BOUND
    clock.advance(1)
    assert await other.bind(Holder(mac(4)), first, POOL, lease_time_s=60) is not None
    # once the other server renewed it, that server may move it; the first may not
    assert await repo.bind(Holder(mac(4)), second, POOL, lease_time_s=60) is None
    moved = await other.bind(Holder(mac(4)), second, POOL, lease_time_s=60)
    assert moved is not None and moved.ip == second
    clock.advance(61)  # a lapsed binding is nobody's: any server may move it
    assert await repo.bind(Holder(mac(4)), first, POOL, lease_time_s=60) is not None


async def test_reservations_are_never_reclaimed(repo: LeaseRepo, lease_store: Store,
                                                clock: Clock) -> None:
    node = await lease_store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname="gpu-1",
                                                  macs=(mac(1),)), actor="test")
    reserved = await repo.offer(Holder(mac(1), node.id, "gpu-1"), POOL, hold_s=60)
    assert reserved is not None and reserved.reserved
    await repo.bind(Holder(mac(1), node.id), reserved.ip, POOL, lease_time_s=60)
    clock.advance(3600)
    await repo.expire()
    # Fill the pool with others whose leases then lapse: they reclaim each other, never it.
    for n in range(2, 30):
        lease = await repo.offer(Holder(mac(n)), POOL, hold_s=10)
        assert lease is not None and lease.ip != reserved.ip
        clock.advance(11)
    back = await repo.offer(Holder(mac(1)), POOL, hold_s=60)
    assert back is not None and back.ip == reserved.ip and back.node_id == node.id
    # The reserved node asking for a different address is refused (its address is fixed).
    assert await repo.bind(Holder(mac(1), node.id), IPv4Address("10.77.0.109"), POOL,
                           lease_time_s=60) is None


async def test_pool_exhaustion_then_reclaim_oldest_expired(repo: LeaseRepo,
                                                           clock: Clock) -> None:
    for n in range(10):
        lease = await repo.offer(Holder(mac(n)), POOL, hold_s=60)
        assert lease is not None
        await repo.bind(Holder(mac(n)), lease.ip, POOL, lease_time_s=100 + n)
    assert await repo.offer(Holder(mac(50)), POOL, hold_s=60) is None
    clock.advance(101)  # only mac(0)'s lease (100 s) has lapsed
    taken = await repo.offer(Holder(mac(50)), POOL, hold_s=60)
    assert taken is not None and taken.ip == IPv4Address("10.77.0.100")
    assert await repo.get(mac(0)) is not None  # an offer changes nothing in the store ...
    assert await repo.bind(Holder(mac(50)), taken.ip, POOL, lease_time_s=60) is not None
    assert await repo.get(mac(0)) is None  # ... the bind reclaims the lapsed lease


async def test_decline_parks_the_address(repo: LeaseRepo, clock: Clock) -> None:
    first = await repo.offer(Holder(mac(1)), POOL, hold_s=60)
    assert first is not None  # a client declines the address it was ACKed (RFC 2131 §3.1)
    assert await repo.bind(Holder(mac(1)), first.ip, POOL, lease_time_s=60) is not None
    assert await repo.decline(mac(1), first.ip, hold_s=600) is DeclineOutcome.DECLINED
    second = await repo.offer(Holder(mac(1)), POOL, hold_s=60)
    assert second is not None and second.ip != first.ip
    parked = [lease for lease in await repo.all() if lease.ip == first.ip]
    assert parked[0].state == LeaseState.DECLINED and parked[0].mac.startswith("declined:")
    clock.advance(601)
    assert await repo.expire() >= 1
    assert all(lease.ip != first.ip for lease in await repo.all())


async def test_decline_never_takes_a_reservation_or_another_clients_lease(
        repo: LeaseRepo, lease_store: Store) -> None:
    """A DECLINE proves nothing about its sender: a known node's reservation stays, and so
    does a dynamic lease the named client does not hold (another address, another client
    identifier)."""
    node = await lease_store.nodes.create(NewNode(state=NodeState.ENROLLED, macs=(mac(2),)),
                                          actor="test")
    known = await repo.offer(Holder(mac(2), node.id), POOL, hold_s=60)
    assert known is not None
    assert await repo.bind(Holder(mac(2), node.id), known.ip, POOL,
                           lease_time_s=60) is not None
    assert await repo.decline(mac(2), known.ip, hold_s=600) is DeclineOutcome.RESERVED
    kept = await repo.get(mac(2))
    assert kept is not None and kept.ip == known.ip and kept.state == LeaseState.BOUND
    dynamic = await repo.offer(Holder(mac(3), client_id="01aa"), POOL, hold_s=60)
    assert dynamic is not None
    assert await repo.bind(Holder(mac(3), client_id="01aa"), dynamic.ip, POOL,
                           lease_time_s=60) is not None
    assert await repo.decline(mac(3), known.ip, hold_s=600) is DeclineOutcome.NOT_ITS_LEASE
    assert await repo.decline(mac(3), dynamic.ip, hold_s=600,
                              client_id="01bb") is DeclineOutcome.NOT_ITS_LEASE
    assert (await repo.get(mac(3))).state == LeaseState.BOUND  # type: ignore[union-attr]
    assert await repo.decline(mac(3), dynamic.ip, hold_s=600,
                              client_id="01aa") is DeclineOutcome.DECLINED


async def test_expire_marks_lapsed_leases(repo: LeaseRepo, clock: Clock) -> None:
    lease = await repo.offer(Holder(mac(1)), POOL, hold_s=30)
    assert lease is not None
    assert await repo.bind(Holder(mac(1)), lease.ip, POOL, lease_time_s=60) is not None
    clock.advance(61)
    assert await repo.expire() == 1
    assert (await repo.get(mac(1))).state == LeaseState.EXPIRED  # type: ignore[union-attr]


async def test_an_offer_is_held_in_memory_and_never_written(repo: LeaseRepo,
                                                            clock: Clock) -> None:
    first = await repo.offer(Holder(mac(1)), POOL, hold_s=30)
    second = await repo.offer(Holder(mac(2)), POOL, hold_s=30)
    assert first is not None and second is not None
    assert first.state == second.state == LeaseState.OFFERED
    assert first.ip != second.ip  # two DISCOVERs never get one address
    assert await repo.all() == []  # ... and neither offer cost a store write
    assert (await repo.offer(Holder(mac(1)), POOL, hold_s=30)).ip == first.ip  # type: ignore[union-attr]
    assert await repo.bind(Holder(mac(3)), first.ip, POOL, lease_time_s=60) is None  # held
    await repo.forget_offer(mac(1))  # mac(1) took another server's offer
    taken = await repo.bind(Holder(mac(3)), first.ip, POOL, lease_time_s=60)
    assert taken is not None and taken.state == LeaseState.BOUND
    clock.advance(31)  # mac(2)'s hold ran out: its address may go to another
    assert await repo.expire() == 1
    assert await repo.bind(Holder(mac(4)), second.ip, POOL, lease_time_s=60) is not None
    assert [(lease.mac, lease.ip) for lease in await repo.all()] == [
        (mac(3), first.ip), (mac(4), second.ip)]


async def test_a_renewal_that_changes_nothing_writes_nothing(lease_store: Store,
                                                             clock: Clock) -> None:
    repo = LeaseRepo(lease_store.engine, lease_store.pool, clock=clock, cache_threshold=0.25)
    holder = Holder(mac(1), hostname="gpu-1")
    offered = await repo.offer(holder, POOL, hold_s=30)
    assert offered is not None
    bound = await repo.bind(holder, offered.ip, POOL, lease_time_s=600)
    assert bound is not None and repo.seconds_left(bound) == 600
    clock.advance(100)  # iPXE's second DORA, seconds after the ROM's: answered from the row
    cached = await repo.bind(holder, offered.ip, POOL, lease_time_s=600)
    assert cached is not None and cached.expires_at == bound.expires_at
    assert repo.seconds_left(cached) == 500
    renamed = await repo.bind(Holder(mac(1), hostname="gpu-9"), offered.ip, POOL,
                              lease_time_s=600)  # a changed holder is written at once
    assert renamed is not None and renamed.expires_at == clock.now + timedelta(seconds=600)
    clock.advance(200)  # past a quarter of the lease time since the last write: written
    renewed = await repo.renew(Holder(mac(1), hostname="gpu-9"), offered.ip, POOL,
                               lease_time_s=600)
    assert renewed is not None and renewed.expires_at == clock.now + timedelta(seconds=600)
    stored = await repo.get(mac(1))
    assert stored is not None and stored.expires_at == renewed.expires_at


async def test_concurrent_requests_never_share_an_address(lease_store: Store,
                                                          clock: Clock) -> None:
    """Many writers at once, each with its own offers in memory (like several daemons:
    threads on PostgreSQL; SQLite serialises on its one writer): two writers may offer one
    address, only one binds it, the other's client is NAKed and starts over."""
    workers = 1 if lease_store.engine.dialect.name == "sqlite" else 8
    big = AddressRange.parse("10.77.1.0-10.77.1.255", "255.255.0.0")

    async def dora(repo: LeaseRepo, holder: Holder) -> tuple[Lease | None, int]:
        for naks in range(50):
            offered = await repo.offer(holder, big, hold_s=60)
            assert offered is not None
            bound = await repo.bind(holder, offered.ip, big, lease_time_s=600)
            if bound is not None:
                return bound, naks
        return None, 50

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lease-test") as pool:
        repos = [LeaseRepo(lease_store.engine, pool, clock=clock) for _ in range(4)]
        results = await asyncio.gather(*(
            dora(repos[n % 4], Holder(mac(n % 200))) for n in range(400)))
    assert [n for n, (lease, _naks) in enumerate(results) if lease is None] == []  # all got one
    stored = await LeaseRepo(lease_store.engine, lease_store.pool).all()
    assert {lease.mac for lease in stored} == {mac(n) for n in range(200)}
    assert len({lease.ip for lease in stored}) == len(stored) == 200  # ... its own
    assert all(lease.state == LeaseState.BOUND for lease in stored)
