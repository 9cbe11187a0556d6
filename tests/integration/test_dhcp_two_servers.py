"""Two of our DHCP servers answer one segment by mistake, both on one real PostgreSQL
(PEERS.md §11): they never give one address to two MACs.

Topology: a bridge ``br0`` in namespace H joins four namespaces: server A (10.77.0.1) and
server B (10.77.0.3), each a ``DhcpServer`` of this test's event loop with its own store
(engine, pool, instance) on the same database and the same pool, and two clients. Kea's
``perfdhcp`` (a relay) runs against each server at the same time with the same simulated
MACs, so both servers allocate from one pool for one set of clients at once; then a third
run broadcasts on the segment, so every DISCOVER reaches both servers. Run twice: each
server in this test's loop alone, then each in its loop and two DHCP worker processes
(``dhcp.workers = 2``: six lease repositories on one database). Afterwards every
address each server acknowledged (its log) went to one MAC only, and the shared ``lease``
table agrees with every acknowledgement."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner.boot.dhcp import DhcpServer
from provisioner.boot.dhcp_workers import DhcpProcesses
from provisioner.boot.stack import Server
from provisioner.config import BootSettings, DhcpSettings, Settings
from provisioner.store.leases import LeaseRepo, LeaseState
from provisioner.store.store import Store, open_store
from tests.integration.conftest import _databases
from tests.peers.dhcp_client import MemoryInventory
from tests.peers.dhcp_netns import Namespace, entered, netns_unavailable_reason, veth
from tests.peers.postgres import PostgresServer

pytestmark = [pytest.mark.root, pytest.mark.postgres]
SERVERS = {"a": "10.77.0.1", "b": "10.77.0.3"}
CLIENTS = {"c1": "10.77.0.11", "c2": "10.77.0.12"}
POOL = "10.77.0.100-10.77.0.199"
MACS = 80  # simulated clients per perfdhcp run (-R); with the broadcast run's 80 more than
# the pool's 100 addresses: the servers also reclaim lapsed offers from each other
BOUND = re.compile(r"DHCP: bound (\S+) to (\S+)")


@pytest.fixture(scope="module", autouse=True)
def _needs_netns() -> None:
    if (reason := netns_unavailable_reason()) is not None:
        pytest.skip(reason)
    if shutil.which("perfdhcp") is None:
        pytest.fail("kea-admin (perfdhcp) missing: run scripts/setup.sh")


@dataclass
class Segment:
    hub: Namespace
    servers: dict[str, Namespace]
    clients: dict[str, Namespace]


@pytest.fixture
def segment() -> Iterator[Segment]:
    hub = Namespace("pvh")
    spaces: dict[str, Namespace] = {}
    try:
        hub.ip("link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
        hub.ip("link", "set", "br0", "up")
        for n, (name, address) in enumerate({**SERVERS, **CLIENTS}.items()):
            spaces[name] = Namespace(f"pv{name}")
            veth(hub, f"p{n}", spaces[name], "eth0")
            hub.ip("link", "set", f"p{n}", "master", "br0")
            spaces[name].ip("addr", "add", f"{address}/24", "dev", "eth0")
        yield Segment(hub, {k: spaces[k] for k in SERVERS}, {k: spaces[k] for k in CLIENTS})
    finally:
        for space in spaces.values():
            space.close()
        hub.close()


@pytest.fixture
def database_url(postgres: PostgresServer) -> str:
    return postgres.create_database(f"pv_dhcp2_{next(_databases)}")


@pytest.fixture
def stores(database_url: str, tmp_path: Path) -> Iterator[dict[str, Store]]:
    settings = Settings(state_dir=tmp_path / "state", database_url=database_url)
    opened = {name: open_store(settings, instance=f"dhcp-{name}") for name in SERVERS}
    yield opened
    for one in opened.values():
        one.close()


@pytest.fixture(params=[0, 2], ids=["in-process", "2-workers"])
async def servers(request: pytest.FixtureRequest, segment: Segment, stores: dict[str, Store],
                  database_url: str, postgres: PostgresServer,
                  caplog: pytest.LogCaptureFixture) -> AsyncIterator[
        dict[str, Server]]:
    """Each server in this test's loop, or there and in two worker processes of its own
    (their log records come back to this process: INFO, for the "bound" lines)."""
    caplog.set_level(logging.INFO, logger="provisioner")
    started: dict[str, Server] = {}
    try:
        for name, address in SERVERS.items():
            settings = DhcpSettings.model_validate(
                {"mode": "authoritative", "interface": "eth0", "server_address": address,
                 "pool": POOL, "lease_time_s": 600, "workers": request.param})
            url = f"http://{address}:8080"
            server: Server = DhcpServer(
                settings, BootSettings(), http_base_url=url, inventory=MemoryInventory(),
                leases=LeaseRepo(stores[name].engine, stores[name].pool),
            ) if request.param == 0 else DhcpProcesses(
                settings, BootSettings(), http_base_url=url,
                database_url=postgres.unix_url(database_url),  # workers start in the namespace
                inventory=MemoryInventory(), changes=None, count=request.param,
                leases=LeaseRepo(stores[name].engine, stores[name].pool))
            with entered(segment.servers[name]):
                await server.start()
            started[name] = server
        yield started
    finally:
        for server in started.values():
            await server.stop()


async def _perfdhcp(ns: Namespace, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns.name, "perfdhcp", "-4", "-R", str(MACS), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    text = out.decode(errors="replace")
    assert proc.returncode in (0, 3), text  # 3: some exchanges lost (two servers answer)
    return text


def _received(out: str) -> int:
    return sum(int(n) for n in re.findall(r"received packets: (\d+)", out))


async def test_two_servers_on_one_segment_never_give_one_address_to_two_macs(
        segment: Segment, servers: dict[str, Server], stores: dict[str, Store],
        caplog: pytest.LogCaptureFixture) -> None:
    c1, c2 = segment.clients["c1"], segment.clients["c2"]
    # the same MACs (perfdhcp's default base) relayed to A and to B at once
    relayed = await asyncio.gather(
        _perfdhcp(c1, "-l", CLIENTS["c1"], "-r", "100", "-p", "6", SERVERS["a"]),
        _perfdhcp(c2, "-l", CLIENTS["c2"], "-r", "100", "-p", "6", SERVERS["b"]))
    assert all(_received(out) > 100 for out in relayed), relayed
    # then broadcast on the segment: every DISCOVER reaches both servers
    broadcast = await _perfdhcp(c1, "-l", "eth0", "-B", "-r", "50", "-p", "4",
                                "-b", "mac=52:54:00:77:00:00")
    acks: dict[str, set[str]] = defaultdict(set)
    for record in caplog.records:
        if found := BOUND.search(record.getMessage()):
            acks[found.group(1)].add(found.group(2))
    assert len(acks) >= 50, "too few acknowledgements logged to judge"
    twice = {ip: macs for ip, macs in acks.items() if len(macs) > 1}
    assert not twice, f"addresses acknowledged to two MACs: {twice}"
    table = await LeaseRepo(stores["a"].engine, stores["a"].pool).all()
    by_ip = {str(lease.ip): lease for lease in table}
    assert len(by_ip) == len(table)  # one row per address
    for ip, macs in acks.items():  # every acknowledgement is the table's binding
        lease = by_ip[ip]
        assert lease.mac in macs and lease.state == LeaseState.BOUND, (ip, macs, lease)
    broadcast_macs = {mac for macs in acks.values() for mac in macs
                      if mac.startswith("52:54:00:77")}
    print(f"\ntwo DHCP servers, one segment: {len(acks)} addresses acknowledged to "
          f"{sum(map(len, acks.values()))} MACs (relayed to each server at once, then "
          f"{len(broadcast_macs)} MACs by broadcast to both), none to two MACs; "
          f"perfdhcp received {[_received(out) for out in relayed]} relayed, "
          f"{_received(broadcast)} broadcast")
