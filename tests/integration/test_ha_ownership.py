"""Several daemons on one real PostgreSQL (PEERS.md §11): node leases claimed with
``FOR UPDATE SKIP LOCKED``, fencing of every step write, take-over of a dead daemon's nodes.

Each "daemon" here is a Store + Conductor with its own instance id in one process; the
subprocess chaos test (tests/e2e/test_ha_chaos.py) does the same with real processes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.bmc.base import Bmc, BmcFactory
from provisioner.bmc.fake import fake_bmc_factory
from provisioner.config import LifecycleSettings, Settings
from provisioner.domain import (
    BmcCredentials,
    BmcEndpoint,
    HistoryEntry,
    KnownNode,
    MacChanges,
    NewNode,
)
from provisioner.errors import Fenced
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.fleet import FleetMember, Singleton
from provisioner.lifecycle.states import IN_FLIGHT, Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store import hot_sql
from provisioner.store.models import utcnow
from provisioner.store.store import Store, open_store
from tests.conftest import fake_ports
from tests.integration.conftest import _databases
from tests.peers.postgres import PostgresServer
from tests.peers.tcp_proxy import tcp_proxy

pytestmark = pytest.mark.postgres
S = NodeState
LEASE_S = 1.0


@pytest.fixture
def pg_settings(postgres: PostgresServer, tmp_path: Path) -> Settings:
    url = postgres.create_database(f"pv_ha_{next(_databases)}")
    return Settings(state_dir=tmp_path / "state", database_url=url,
                    ha={"lease_s": LEASE_S})  # type: ignore[arg-type]


@pytest.fixture
def stores(pg_settings: Settings) -> Iterator[dict[str, Store]]:
    opened = {name: open_store(pg_settings, instance=name) for name in ("A", "B", "C")}
    yield opened
    for one in opened.values():
        one.close()


def _new(n: int, state: NodeState = S.ENROLLED) -> NewNode:
    serial = f"HA{n:04d}"
    return NewNode(state=state, hostname=f"ha-{n:04d}", serial=serial, profile="gpu",
                   macs=(f"52:54:00:aa:{n >> 8:02x}:{n & 0xff:02x}",),
                   bmc=BmcEndpoint(driver="fake", address=serial), bmc_password="pw")


def check_single_writer(history: list[HistoryEntry]) -> None:
    """Gapless, and fenced writes never interleave: fencing numbers never go down along
    the history, and one fencing number belongs to one instance."""
    assert [h.seq for h in history] == list(range(1, len(history) + 1))
    fenced = [h for h in history if h.fence is not None]
    assert [h.fence for h in fenced] == sorted(h.fence for h in fenced)  # type: ignore[type-var]
    owners: dict[int, str | None] = {}
    for h in fenced:
        assert owners.setdefault(h.fence, h.instance) == h.instance, history  # type: ignore[arg-type]


async def test_a_lost_lease_refuses_every_write(stores: dict[str, Store],
                                                caplog: pytest.LogCaptureFixture) -> None:
    a, b = stores["A"], stores["B"]
    node = await a.nodes.create(_new(1, S.INSPECTING), actor="test")
    fence_a = await a.ownership.claim(node.id)
    assert fence_a == 1
    assert await b.ownership.claim(node.id) is None  # A's lease is live
    node = await a.nodes.save_checkpoint(node, ["bootdev-pxe"], fence=fence_a)
    await asyncio.sleep(LEASE_S + 0.2)  # A is "paused" past its lease
    fence_b = await b.ownership.claim(node.id)
    assert fence_b == 2
    with pytest.raises(Fenced, match="instance A no longer holds"):
        await a.nodes.save_checkpoint(node, ["bootdev-pxe", "power-on"], fence=fence_a)
    with pytest.raises(Fenced):
        await a.nodes.transition(node, to_state=S.INSPECTED, event="done", actor="conductor",
                                 fence=fence_a, release=True)
    assert (await b.nodes.get(node.id)).checkpoint == ("bootdev-pxe",)  # A's write is gone
    done = await b.nodes.transition(await b.nodes.get(node.id), to_state=S.INSPECTED,
                                    event="done", actor="conductor", fence=fence_b,
                                    release=True)
    history = await b.nodes.history(node.id)
    assert (history[-1].instance, history[-1].fence, history[-1].to_state) == (
        "B", 2, "inspected")
    assert history[0].instance == "A" and done.state is S.INSPECTED
    assert not await a.ownership.leases()  # released with the outcome


async def test_concurrent_claims_are_disjoint(stores: dict[str, Store]) -> None:
    a = stores["A"]
    ids = [(await a.nodes.create(_new(n, S.DEPLOYING), actor="test")).id for n in range(60)]
    states = [str(s) for s in IN_FLIGHT]
    got = await asyncio.gather(*(one.ownership.claim_orphans(states, 25)
                                 for one in stores.values()))
    claimed = [set(g) for g in got]
    assert sum(len(c) for c in claimed) == len(set().union(*claimed))  # nobody twice
    assert set().union(*claimed) <= set(ids)
    assert sum(len(c) for c in claimed) == 60  # 3 x 25 >= 60: every node went somewhere
    # a second round finds nothing free: every lease is live
    assert not any(await asyncio.gather(*(one.ownership.claim_orphans(states, 60)
                                          for one in stores.values())))


async def test_a_renewal_does_not_wait_for_a_fenced_write_a_claim_does(
        stores: dict[str, Store]) -> None:
    """A write in progress holds its lease rows (``FOR KEY SHARE``) to its commit: another
    daemon's claim waits for it, our renewal of the same leases does not. With ``FOR SHARE``
    the renewal waited too, and a group commit of several nodes' writes and a renewal locking
    the same rows in other orders was PostgreSQL's ``deadlock detected``: the renewal failed
    and the leases lapsed under steps still running (a CI run of the stand-down test)."""
    a, b = stores["A"], stores["B"]
    ids = [(await a.nodes.create(_new(n, S.DEPLOYING), actor="test")).id for n in (1, 2)]
    fences = {node_id: await a.ownership.claim(node_id) for node_id in ids}
    with a.engine.connect() as conn:  # a group commit's fenced checks, not committed yet
        for node_id in reversed(ids):
            held = conn.execute(hot_sql.HELD, {"b_id": node_id, "b_owner": "A",
                                               "b_fence": fences[node_id]}).first()
            assert held is not None
        async with asyncio.timeout(5):
            assert await a.ownership.renew(fences) == set(ids)  # type: ignore[arg-type]
        claim = asyncio.create_task(b.ownership.claim(ids[0], force=True))
        await asyncio.sleep(0.5)
        assert not claim.done()  # an operator's abort on B waits for A's write to commit
        conn.commit()
    assert await claim == fences[ids[0]] + 1  # type: ignore[operator]


async def _until_all(store: Store, ids: list[str], state: NodeState, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            nodes = [await store.nodes.get(i) for i in ids]
            if all(n.state == state for n in nodes):
                return
            failed = [n for n in nodes if n.state not in IN_FLIGHT and n.state != state
                      and n.state not in (S.ENROLLED, S.INSPECTED)]
            assert not failed, [(n.id, n.state, n.last_error) for n in failed]
            await asyncio.sleep(0.1)


async def test_a_dead_daemons_nodes_are_taken_over(stores: dict[str, Store], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A drives 24 nodes and dies mid-onboarding (its tasks vanish, its leases stay); B
    and C take them over after the lease and finish them: every node active, each history
    one gapless pass, fenced writes never interleave, every side effect once."""
    caplog.set_level(logging.WARNING)
    world = SimWorld(tmp_path / "world.sqlite")
    conductors = {name: Conductor(one.nodes, fake_ports(world, delay_s=0.2),
                                  LifecycleSettings(), ownership=one.ownership)
                  for name, one in stores.items()}
    members = {name: FleetMember(conductors[name], one.ownership, api_listen=name)
               for name, one in stores.items()}
    ids = [(await conductors["A"].enroll(_new(n), actor="test")).id for n in range(24)]
    beats = {name: asyncio.create_task(members[name].run()) for name in ("A",)}
    await asyncio.sleep(1.0)  # A is mid-way: some inspecting, some deploying
    in_flight = [n for n in await stores["A"].nodes.in_states(IN_FLIGHT)]
    assert in_flight, "A should be driving nodes when it dies"
    beats.pop("A").cancel()
    await conductors["A"].stop()  # SIGKILL-like: no release, leases stay until expiry
    assert {lease.owner for lease in await stores["B"].ownership.leases()} == {"A"}
    beats |= {name: asyncio.create_task(members[name].run()) for name in ("B", "C")}
    try:
        await _until_all(stores["B"], ids, S.ACTIVE, timeout_s=90)
    finally:
        for task in beats.values():
            task.cancel()
        for name in ("B", "C"):
            await conductors[name].stop()
    instances: set[str | None] = set()
    for node_id in ids:
        history = await stores["B"].nodes.history(node_id)
        check_single_writer(history)
        assert history[-1].to_state == "active"
        instances |= {h.instance for h in history}
    assert instances >= {"A"} and instances & {"B", "C"}
    for (_key, op), (_calls, effects) in world.ledger_blocking().items():
        assert effects <= 1 or op in ("power_on", "power_off", "bootdev"), (_key, op, effects)
    assert "took over" in caplog.text
    world.close()


async def test_abort_fences_the_daemon_driving_the_node(stores: dict[str, Store],
                                                        tmp_path: Path) -> None:
    """An operator's abort on B of a node A drives takes the lease: A's step stops at
    its next write (refused), A writes nothing more for that node."""
    world = SimWorld(tmp_path / "world.sqlite")
    lifecycle = LifecycleSettings(auto_inspect=False, auto_deploy=False)
    cond_a = Conductor(stores["A"].nodes, fake_ports(world, delay_s=0.3), lifecycle,
                       ownership=stores["A"].ownership)
    cond_b = Conductor(stores["B"].nodes, fake_ports(world), lifecycle,
                       ownership=stores["B"].ownership)
    node = await cond_a.enroll(_new(7), actor="test")
    await cond_a.fire(node.id, Event.INSPECT, actor="op")
    assert await stores["B"].ownership.claim(node.id) is None  # A drives it
    aborted = await cond_b.fire(node.id, Event.ABORT, actor="op", reason="wrong rack")
    await asyncio.sleep(1.0)  # A's step reaches its next checkpoint: refused
    await cond_a.stop()
    await cond_b.stop()
    history = await stores["B"].nodes.history(node.id)
    check_single_writer(history)
    assert history[-1].seq == aborted.history_seq and history[-1].instance == "B"
    assert (await stores["B"].nodes.get(node.id)).state == aborted.state
    world.close()


async def test_one_singleton_leader_and_it_moves(stores: dict[str, Store]) -> None:
    runs: dict[str, int] = {"A": 0, "B": 0, "C": 0}

    def work_for(name: str):  # type: ignore[no-untyped-def]
        async def work() -> None:
            while True:
                runs[name] += 1
                await asyncio.sleep(0.05)
        return work

    singles = {name: Singleton(one.ownership, "fleet", [("count", work_for(name))])
               for name, one in stores.items()}
    tasks = {name: asyncio.create_task(s.run()) for name, s in singles.items()}
    await asyncio.sleep(0.8)
    leaders = [name for name, s in singles.items() if s.leading]
    assert len(leaders) == 1
    first = leaders[0]
    tasks.pop(first).cancel()  # the leader dies without releasing
    await asyncio.sleep(0.1)
    before = dict(runs)
    await asyncio.sleep(LEASE_S * 2.5)
    leaders = [name for name, s in singles.items() if s.leading and name != first]
    assert len(leaders) == 1 and runs[leaders[0]] > before[leaders[0]]
    assert runs[first] == before[first]  # the dead leader's work stopped
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_instances_lists_live_daemons_leases_and_leader(stores: dict[str, Store]) -> None:
    a, b = stores["A"], stores["B"]
    node = await a.nodes.create(_new(3, S.INSPECTING), actor="test")
    await a.ownership.heartbeat("127.0.0.1:1")
    await b.ownership.heartbeat("127.0.0.1:2")
    assert await a.ownership.claim(node.id) == 1
    assert await b.ownership.lead("fleet") == 1
    infos = {i.id: i for i in await a.ownership.instances()}
    assert set(infos) == {"A", "B"}
    assert (infos["A"].leases, infos["A"].singletons) == (1, ())
    assert (infos["B"].leases, infos["B"].singletons, infos["B"].api_listen) == (
        0, ("fleet",), "127.0.0.1:2")
    await asyncio.sleep(LEASE_S + 0.2)  # no heartbeat: both fall out of the list
    assert await a.ownership.instances() == []
    await a.ownership.heartbeat("127.0.0.1:1")
    assert await a.ownership.release_all() == 1
    assert await a.ownership.instances() == []  # a clean stop leaves the list at once


async def test_other_daemons_writes_clear_the_mac_caches(stores: dict[str, Store],
                                                         pg_settings: Settings,
                                                         tmp_path: Path) -> None:
    """B saw a MAC as unknown (negative cache, 30 s TTL); A enrolls a node with it: B's
    cache drops it on A's NOTIFY, so B knows the node at once, long before the TTL; B's
    listeners (its DHCP worker processes' caches) hear of every MAC that changed."""
    from sqlalchemy.engine import make_url

    from provisioner.lifecycle.discovery import Discovery, TokenBucket
    from provisioner.store.notify import Listener, NodeChanged

    world = SimWorld(tmp_path / "world.sqlite")
    lifecycle = LifecycleSettings(auto_inspect=False, auto_deploy=False)
    cond_b = Conductor(stores["B"].nodes, fake_ports(world), lifecycle,
                       ownership=stores["B"].ownership)
    discovery = Discovery(stores["B"].nodes, cond_b, TokenBucket(0.001, 1),
                          unknown_ttl_s=30.0)
    heard: list[NodeChanged] = []
    arrived = asyncio.Event()
    told: list[MacChanges | None] = []  # what B's DHCP worker processes would be told
    discovery.add_listener(told.append)

    def changed(notice: NodeChanged) -> None:
        heard.append(notice)
        discovery.forget(notice.macs)
        arrived.set()

    url = make_url(pg_settings.sqlalchemy_url).set(drivername="postgresql")
    listener = Listener(url.render_as_string(hide_password=False), "B",
                        asyncio.get_running_loop(), changed, discovery.forget_all)
    listener.start()
    try:
        await asyncio.sleep(0.5)  # LISTEN in place
        new = _new(40)
        mac = new.macs[0]
        assert await discovery.lookup(mac) is None  # unknown: now in B's negative cache
        node = await stores["A"].nodes.create(new, actor="test")
        async with asyncio.timeout(10):
            await arrived.wait()
        assert heard[0] == NodeChanged("A", node.id, (mac,))
        assert told == [{mac: None}]  # A's write: B's workers read the store again
        known = await discovery.lookup(mac)
        assert known is not None and known.node_id == node.id
        await stores["B"].nodes.create(_new(41), actor="test")  # B's own: not delivered
        await asyncio.sleep(0.5)
        assert len(heard) == 1
        assert told == [{mac: None}]
        mine = await cond_b.enroll(_new(42), actor="test", reason="test")  # B's conductor
        assert told[1:] == [{m: KnownNode(mine.id, mine.hostname, str(mine.state))  # writes:
                             for m in _new(42).macs}]  # the node as written, no read
        discovery.forget_all()  # B's listen connection was lost: notices may be missed
        assert told[-1] is None
    finally:
        listener.stop()
        await cond_b.stop()
        world.close()


async def test_two_daemons_dhcp_on_one_segment_never_share_an_address(
        stores: dict[str, Store]) -> None:
    """Two daemons serving one segment by mistake hear the same DISCOVERs and both offer
    (offers are held in each daemon's memory, so both may offer one address); each client
    REQUESTs one server's offer, the other forgets its own. The shared lease table's
    uniqueness binds each address to one MAC, each MAC to one address, until the pool runs
    out; a client that lost a race is NAKed and starts over."""
    from provisioner.store.leases import AddressRange, Holder, Lease, LeaseRepo, LeaseState

    pool = AddressRange.parse("10.88.0.10-10.88.0.49", "255.255.255.0")  # 40 addresses
    repos = [LeaseRepo(stores[name].engine, stores[name].pool) for name in ("A", "B")]
    macs = [f"52:54:00:88:00:{n:02x}" for n in range(60)]

    async def client(n: int, mac: str) -> Lease | None:
        for attempt in range(20):
            offers = await asyncio.gather(*(r.offer(Holder(mac), pool, hold_s=60)
                                            for r in repos))
            pick = (n + attempt) % 2  # the first offer to arrive: either server
            chosen, other = repos[pick], repos[1 - pick]
            await other.forget_offer(mac)
            offer = offers[pick]
            if offer is None:
                return None  # this server's pool is full
            bound = await chosen.bind(Holder(mac), offer.ip, pool, lease_time_s=600)
            if bound is not None:
                return bound
        raise AssertionError(f"{mac} NAKed 20 times")

    results = await asyncio.gather(*(client(n, m) for n, m in enumerate(macs)))
    bound = [lease for lease in results if lease is not None]
    assert len({lease.ip for lease in bound}) == len(bound) == 40  # the pool, once each
    stored = await repos[0].all()
    assert len({lease.ip for lease in stored}) == len(stored) == 40
    assert {lease.mac for lease in stored} == {lease.mac for lease in bound}
    assert all(lease.state == LeaseState.BOUND for lease in stored)


async def test_maintenance_set_on_another_daemon_parks_the_step(
        stores: dict[str, Store], pg_settings: Settings, tmp_path: Path) -> None:
    """B sets maintenance on a node A is deploying: A hears it (NOTIFY) and parks the
    step before its next sub-step; cleared on B, the step goes on at A to ``active``."""
    from sqlalchemy.engine import make_url

    from provisioner.store.notify import Listener, NodeChanged

    world = SimWorld(tmp_path / "world.sqlite")
    manual = LifecycleSettings(auto_inspect=False, auto_deploy=False)
    cond_a = Conductor(stores["A"].nodes, fake_ports(world, delay_s=0.3), manual,
                       ownership=stores["A"].ownership)
    cond_b = Conductor(stores["B"].nodes, fake_ports(world), manual,
                       ownership=stores["B"].ownership)

    def changed(notice: NodeChanged) -> None:
        cond_a.remote_change(notice.node_id)

    url = make_url(pg_settings.sqlalchemy_url).set(drivername="postgresql")
    listener = Listener(url.render_as_string(hide_password=False), "A",
                        asyncio.get_running_loop(), changed, lambda: None)
    listener.start()
    try:
        await asyncio.sleep(0.5)
        node = await cond_a.enroll(_new(50), actor="test")
        await cond_a.fire(node.id, Event.INSPECT, actor="op")
        await cond_b.set_maintenance(node.id, True, actor="op", reason="swap a DIMM",
                                     propagate=False)
        async with asyncio.timeout(10):
            while True:
                if cond_a.step_status(node.id) == "held":
                    break
                await asyncio.sleep(0.05)
        parked = (await stores["A"].nodes.get(node.id)).checkpoint
        await asyncio.sleep(1.0)
        assert (await stores["A"].nodes.get(node.id)).checkpoint == parked  # no sub-step ran
        await cond_b.set_maintenance(node.id, False, actor="op", reason="", propagate=False)
        await wait_until_state(stores["B"], node.id, S.INSPECTED)
        history = await stores["B"].nodes.history(node.id)
        check_single_writer(history)
        assert {h.instance for h in history if h.event.startswith("maintenance")} == {"B"}
        assert history[-1].instance == "A"
    finally:
        listener.stop()
        await cond_a.stop()
        await cond_b.stop()
        world.close()


async def wait_until_state(store: Store, node_id: str, state: NodeState) -> None:
    async with asyncio.timeout(30):
        while True:
            if (await store.nodes.get(node_id)).state == state:
                return
            await asyncio.sleep(0.1)


async def test_a_daemon_cut_from_the_database_stops_its_bmc_calls_before_its_leases_expire(
        pg_settings: Settings, postgres: PostgresServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A reaches PostgreSQL through a proxy that is cut while it drives 12 nodes: within two
    thirds of a lease it stops its steps (no BMC call from then on, though the database
    stays away for two leases and B takes the nodes over meanwhile); restored, it drives
    nothing it lost, and every node ends active with single-writer histories."""
    caplog.set_level(logging.WARNING)
    assert pg_settings.database_url is not None
    direct = pg_settings.database_url.get_secret_value()
    with tcp_proxy(postgres.port) as proxy:
        via_proxy = Settings(state_dir=pg_settings.state_dir, ha={"lease_s": LEASE_S},
                             database_url=direct.replace(f":{postgres.port}/",
                                                         f":{proxy.port}/"))
        a, b = open_store(via_proxy, instance="A"), open_store(pg_settings, instance="B")
        world = SimWorld(tmp_path / "world.sqlite")
        a_calls = _BmcCalls(world, "A", b)  # the BMC calls A makes, when, and under which lease
        ports = {"A": replace(fake_ports(world, delay_s=0.1), bmc=a_calls.factory()),
                 "B": fake_ports(world, delay_s=0.1)}
        conductors = {name: Conductor(one.nodes, ports[name], LifecycleSettings(),
                                      ownership=one.ownership)
                      for name, one in (("A", a), ("B", b))}
        members = {name: FleetMember(conductors[name], one.ownership, api_listen=name)
                   for name, one in (("A", a), ("B", b))}
        ids = [(await conductors["A"].enroll(_new(n), actor="test")).id for n in range(12)]
        beats = [asyncio.create_task(members["A"].run())]
        try:
            await _until(lambda: _owners(b, at_least=6), 30)  # A drives half of them
            proxy.cut()
            await asyncio.sleep(LEASE_S * 2 / 3 + 0.25)  # the guard's period and one call
            assert "stopped driving" in caplog.text
            stood_down = time.monotonic()
            await asyncio.sleep(LEASE_S * 1.5)  # past every lease A held: B may take over
            beats.append(asyncio.create_task(members["B"].run()))
            await _until(lambda: _owners(b, only="B"), 30)  # B took A's nodes over
            proxy.restore()  # A's database answers again while B drives its old nodes
            await _until_all(b, ids, S.ACTIVE, timeout_s=60)
        finally:
            for task in beats:
                task.cancel()
            for conductor in conductors.values():
                await conductor.stop()
        # A's steps ended at the cut: none woke when the database came back to call the BMC
        # of a node B drives (a write of theirs still queued in the store is refused). A
        # may take a node back once it answers again, if B's lease on it lapsed: a call
        # under a live lease of A's is its own
        assert [(op, node) for op, node, at, held in a_calls.calls
                if at >= stood_down and not held] == []
        assert a_calls.calls, "A drove nodes before the cut"
        for node_id in ids:
            history = await b.nodes.history(node_id)
            check_single_writer(history)
            assert history[-1].to_state == "active"
        for (_key, op), (_calls, effects) in world.ledger_blocking().items():
            assert effects <= 1 or op in ("power_on", "power_off", "bootdev"), (_key, op)
        world.close()
        a.close()
        b.close()


class _BmcCalls:
    """The simulated machines as one daemon's BMCs, recording each side effect asked through
    them: the operation, the node, when, and whether daemon ``instance`` held a live lease on
    the node at that moment (read through ``leases``, another daemon's store)."""

    def __init__(self, world: SimWorld, instance: str, leases: Store) -> None:
        self._world = world
        self._instance = instance
        self._leases = leases
        self._nodes: dict[str, str] = {}  # BMC address -> node id
        self.calls: list[tuple[str, str, float, bool]] = []

    def factory(self) -> BmcFactory:
        fake = fake_bmc_factory(self)

        def make(node_id: str, endpoint: BmcEndpoint, credentials: BmcCredentials) -> Bmc:
            self._nodes[endpoint.address] = node_id
            return fake(node_id, endpoint, credentials)

        return make

    async def get(self, key: str, attr: str) -> str:
        return await self._world.get(key, attr)

    async def ensure(self, key: str, op: str, attr: str, value: str) -> bool:
        at, node_id = time.monotonic(), self._nodes[key]
        now = utcnow()
        held = any(lease.node_id == node_id and lease.owner == self._instance
                   and lease.expires_at is not None and lease.expires_at > now
                   for lease in await self._leases.ownership.leases())
        self.calls.append((op, node_id, at, held))
        return await self._world.ensure(key, op, attr, value)


async def _owners(store: Store, *, at_least: int = 0, only: str | None = None) -> bool:
    leases = await store.ownership.leases()
    return len(leases) >= at_least and (only is None or {x.owner for x in leases} == {only})


async def _until(ready: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if await ready():
                return
            await asyncio.sleep(0.05)


async def test_a_cut_off_step_records_no_history_and_writes_no_facts(
        stores: dict[str, Store], tmp_path: Path) -> None:
    """A's step outlives its lease (paused past it; nothing renews it) and B takes the node
    over: the step's ``ctx.record``, ``ctx.update_facts`` and ``ctx.merge_facts`` are
    refused with Fenced, as its state writes are, and write nothing; the step stops. B,
    the owner now, records fine."""
    world = SimWorld(tmp_path / "world.sqlite")
    reached, go, tried = asyncio.Event(), asyncio.Event(), asyncio.Event()
    refused: list[str] = []

    async def step(ctx) -> None:  # type: ignore[no-untyped-def]
        async def first() -> None:
            await ctx.record("probe_note", "while the lease is ours")

        await ctx.substep("first", first)
        reached.set()
        await go.wait()
        writes = {"record": lambda: ctx.record("probe_note", "after the lease moved"),
                  "update_facts": lambda: ctx.update_facts(lambda f: f | {"stale": 1}),
                  "merge_facts": lambda: ctx.merge_facts({"stale": 2})}
        for name, write in writes.items():
            try:
                await write()
            except Fenced:
                refused.append(name)
        tried.set()
        raise Fenced("stop here")

    lifecycle = LifecycleSettings(auto_inspect=False, auto_deploy=False)
    cond_a = Conductor(stores["A"].nodes, fake_ports(world), lifecycle,
                       steps={S.INSPECTING: step}, ownership=stores["A"].ownership)
    cond_b = Conductor(stores["B"].nodes, fake_ports(world), lifecycle,
                       ownership=stores["B"].ownership)
    node = await cond_a.enroll(_new(8), actor="test")
    await cond_a.fire(node.id, Event.INSPECT, actor="op")
    async with asyncio.timeout(5):
        await reached.wait()
    await asyncio.sleep(LEASE_S + 0.2)  # A's lease runs out
    fence_b = await stores["B"].ownership.claim(node.id)
    assert fence_b == 2
    go.set()
    async with asyncio.timeout(5):
        await tried.wait()
    assert refused == ["record", "update_facts", "merge_facts"]
    after = await stores["B"].nodes.get(node.id)
    assert "stale" not in after.facts and after.state is S.INSPECTING
    history = await stores["B"].nodes.history(node.id)
    notes = [h for h in history if h.event == "probe_note"]
    assert [(h.reason, h.instance, h.fence) for h in notes] == [
        ("while the lease is ours", "A", 1)]  # the step's row carries its fencing number
    recorded = await cond_b.record(node.id, "probe_note", actor="conductor",
                                   reason="by the owner", fence=fence_b)
    history = await stores["B"].nodes.history(node.id)
    assert (history[-1].seq, history[-1].instance, history[-1].fence) == (
        recorded.history_seq, "B", 2)
    check_single_writer(history)
    await cond_a.stop()
    await cond_b.stop()
    world.close()
