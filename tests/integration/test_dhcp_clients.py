"""The DHCP server against real clients in network namespaces the test creates.

Topology: namespace S (the server, ``vs0`` 10.77.0.1/24) and namespace C (clients, ``vc0``)
joined by a veth pair; the server runs in this test's event loop with its sockets made
inside S. ISC ``dhclient`` and busybox ``udhcpc`` get, renew and release leases; Kea's
``perfdhcp`` (a relay) completes its exchanges; a scripted PXE ROM checks boot options,
relay handling (giaddr, option 82), NAK and DECLINE, also answered by worker processes.
Proxy mode runs beside dnsmasq as the site's DHCP server on a bridge. Nothing has an
address outside these namespaces.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from provisioner.boot.dhcp import DhcpServer
from provisioner.boot.dhcp_codec import ZERO_IP, MessageType, Opt, encode, ips
from provisioner.boot.dhcp_workers import DhcpProcesses
from provisioner.boot.inventory import KnownNode
from provisioner.boot.reuseport import chaddr_index
from provisioner.config import BootSettings, DhcpSettings, Settings
from provisioner.domain import MacChanges, NewNode
from provisioner.lifecycle.states import NodeState
from provisioner.store.leases import LeaseRepo, LeaseState
from provisioner.store.store import Store
from tests.peers.dhcp_client import (
    IPXE_BIOS,
    PXE_UEFI_X64,
    MemoryInventory,
    ScriptedClient,
    by_server,
    request_packet,
)
from tests.peers.dhcp_netns import Namespace, entered, netns_unavailable_reason, veth

pytestmark = pytest.mark.root
SERVER = "10.77.0.1"
HTTP = "http://10.77.0.1:8080"
POOL = "10.77.0.100-10.77.0.199"
CLIENT_MAC = "52:54:00:77:00:21"


@pytest.fixture(scope="module", autouse=True)
def _needs_netns() -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@dataclass
class Segment:
    server: Namespace
    client: Namespace
    dir: Path


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[Segment]:
    server, client = Namespace("pvs"), Namespace("pvc")
    try:
        veth(server, "vs0", client, "vc0")
        server.ip("addr", "add", f"{SERVER}/24", "dev", "vs0")
        client.ip("link", "set", "vc0", "address", CLIENT_MAC)
        yield Segment(server, client, tmp_path)
    finally:
        client.close()
        server.close()


@dataclass
class Served:
    server: DhcpServer
    leases: LeaseRepo
    inventory: MemoryInventory


def _settings(**overrides: object) -> DhcpSettings:
    values: dict[str, object] = {"mode": "authoritative", "interface": "vs0",
                                 "server_address": SERVER, "pool": POOL, "lease_time_s": 120}
    values.update(overrides)
    return DhcpSettings.model_validate(values)


async def _serve(ns: Namespace, settings: DhcpSettings, inventory: MemoryInventory,
                 leases: LeaseRepo | None) -> DhcpServer:
    server = DhcpServer(settings, BootSettings(), http_base_url=HTTP, inventory=inventory,
                        leases=leases)
    with entered(ns):
        await server.start()
    return server


@pytest.fixture
async def served(segment: Segment, store: Store) -> AsyncIterator[Served]:
    inventory = MemoryInventory()
    leases = LeaseRepo(store.engine, store.pool)
    server = await _serve(segment.server, _settings(), inventory, leases)
    yield Served(server, leases, inventory)
    await server.stop()


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _wait_file(path: Path, pattern: str, timeout_s: float = 20.0) -> re.Match[str]:
    async with asyncio.timeout(timeout_s):
        while True:
            if found := re.search(pattern, _text(path), re.M):
                return found
            await asyncio.sleep(0.05)


async def _wait_lease(leases: LeaseRepo, mac: str, state: LeaseState,
                      timeout_s: float = 10.0) -> IPv4Address:
    async with asyncio.timeout(timeout_s):
        while True:
            lease = await leases.get(mac)
            if lease is not None and lease.state == state:
                return lease.ip
            await asyncio.sleep(0.05)


async def _run(ns: Namespace, *cmd: str, timeout_s: float = 30.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns.name, *cmd, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    async with asyncio.timeout(timeout_s):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def _stop(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> None:
    if proc.returncode is None:
        proc.send_signal(sig)
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


# -- ISC dhclient -------------------------------------------------------------------------------

_DHCLIENT_SCRIPT = """#!/bin/sh
echo "$reason ip=$new_ip_address mask=$new_subnet_mask host=$new_host_name \
lease=$new_dhcp_lease_time server=$new_dhcp_server_identifier" >> {log}
case "$reason" in
  BOUND|RENEW|REBIND|REBOOT) ip addr replace "$new_ip_address/24" dev "$interface" ;;
  RELEASE|EXPIRE|STOP) [ -n "$old_ip_address" ] && ip addr del "$old_ip_address/24" \
    dev "$interface" ;;
esac
exit 0
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


async def test_dhclient_gets_lease_reboots_to_same_address_and_releases(  # type: ignore[no-untyped-def]
        segment: Segment, served: Served, make_node) -> None:
    assert shutil.which("dhclient"), "isc-dhcp-client missing: run scripts/setup.sh"
    node = await make_node(NodeState.ACTIVE, macs=(CLIENT_MAC,), hostname="gpu-042")
    served.inventory.known[CLIENT_MAC] = KnownNode(node.id, "gpu-042", "active")
    log, lease_file = segment.dir / "dhclient.log", segment.dir / "dhclient.leases"
    script = _script(segment.dir / "dhclient-script", _DHCLIENT_SCRIPT.format(log=log))
    args = ["dhclient", "-d", "-1", "-v", "-sf", str(script), "-lf", str(lease_file),
            "-pf", str(segment.dir / "dhclient.pid"), "vc0"]
    proc = await asyncio.create_subprocess_exec("ip", "netns", "exec", segment.client.name,
                                                *args, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        bound = await _wait_file(log, r"^BOUND ip=(\S+) mask=255.255.255.0 host=gpu-042 "
                                      r"lease=120 server=10.77.0.1$")
        ip = IPv4Address(bound.group(1))
        assert await _wait_lease(served.leases, CLIENT_MAC, LeaseState.BOUND) == ip
        lease = await served.leases.get(CLIENT_MAC)
        assert lease is not None and lease.reserved and lease.node_id == node.id
        # -r: dhclient sends RELEASE (unicast, from its address) and stops the running one.
        rc, out = await _run(segment.client, "dhclient", "-r", "-sf", str(script), "-lf",
                             str(lease_file), "-pf", str(segment.dir / "dhclient.pid"), "vc0")
        assert rc == 0, out
        assert await _wait_lease(served.leases, CLIENT_MAC, LeaseState.RELEASED) == ip
    finally:
        await _stop(proc)
    # A new run reboots from its lease file (INIT-REBOOT) or rediscovers: the same address.
    log.write_text("")
    rc, out = await _run(segment.client, *args[:1], "-1", "-sf", str(script), "-lf",
                         str(lease_file), "-pf", str(segment.dir / "dhclient.pid"), "vc0")
    try:
        assert rc == 0, out
        again = await _wait_file(log, r"^(?:BOUND|REBOOT) ip=(\S+)")
        assert IPv4Address(again.group(1)) == ip
    finally:
        await _run(segment.client, "dhclient", "-x", "-pf", str(segment.dir / "dhclient.pid"))


# -- busybox udhcpc -----------------------------------------------------------------------------

_UDHCPC_SCRIPT = """#!/bin/sh
echo "$1 ip=$ip mask=$subnet lease=$lease serverid=$serverid" >> {log}
case "$1" in
  bound|renew) ip addr replace "$ip/24" dev "$interface" ;;
  deconfig) ip addr flush dev "$interface" ;;
esac
exit 0
"""


async def test_udhcpc_gets_renews_and_releases(segment: Segment, served: Served) -> None:
    assert shutil.which("busybox"), "busybox missing: run scripts/setup.sh"
    log = segment.dir / "udhcpc.log"
    script = _script(segment.dir / "udhcpc-script", _UDHCPC_SCRIPT.format(log=log))
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", segment.client.name, "busybox", "udhcpc", "-f", "-i", "vc0",
        "-s", str(script), "-t", "5", "-T", "1", "-A", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        bound = await _wait_file(log, r"^bound ip=(\S+) mask=255.255.255.0 lease=120 "
                                      r"serverid=10.77.0.1$")
        ip = IPv4Address(bound.group(1))
        assert ip in [IPv4Address("10.77.0.100") + i for i in range(100)]
        first = await served.leases.get(CLIENT_MAC)
        assert first is not None and first.state == LeaseState.BOUND and first.ip == ip
        await asyncio.sleep(1.1)  # so the renewed expiry is measurably later
        proc.send_signal(signal.SIGUSR1)  # renew now: unicast REQUEST with ciaddr
        await _wait_file(log, rf"^renew ip={re.escape(str(ip))} ")
        renewed = await served.leases.get(CLIENT_MAC)
        assert renewed is not None and renewed.expires_at > first.expires_at
        proc.send_signal(signal.SIGUSR2)  # release
        await _wait_file(log, r"^deconfig ")
        assert await _wait_lease(served.leases, CLIENT_MAC, LeaseState.RELEASED) == ip
        assert served.inventory.unknown == []  # an OS client is not a network boot
    finally:
        await _stop(proc)


# -- Kea perfdhcp (a relay agent) -----------------------------------------------------------------


async def test_perfdhcp_exchanges_complete(segment: Segment, served: Served) -> None:
    assert shutil.which("perfdhcp"), "kea-admin (perfdhcp) missing: run scripts/setup.sh"
    segment.client.ip("addr", "add", "10.77.0.2/24", "dev", "vc0")
    rc, out = await _run(segment.client, "perfdhcp", "-4", "-l", "10.77.0.2", "-r", "100",
                         "-R", "50", "-p", "5", SERVER, timeout_s=60)
    drops = re.findall(r"drops ratio: ([\d.]+) %", out)
    assert len(drops) == 2, out  # DISCOVER-OFFER and REQUEST-ACK
    assert all(float(d) <= 2.5 for d in drops), out
    assert rc in (0, 3), out  # 3 = some exchange lost (tolerated up to the ratio above)
    received = [int(n) for n in re.findall(r"received packets: (\d+)", out)]
    assert received and min(received) > 300, out
    assert len(await served.leases.all()) == 50


# -- a scripted PXE ROM, iPXE and relay agent -----------------------------------------------------


@pytest.fixture
def pxe(segment: Segment) -> Iterator[ScriptedClient]:
    with entered(segment.client):
        client = ScriptedClient.bound("0.0.0.0", 68, interface="vc0")
    yield client
    client.close()


BROADCAST = ("255.255.255.255", 67)


async def _dora(client: ScriptedClient, mac: str, extra: dict[int, bytes]) -> tuple[
        IPv4Address, list[object]]:
    offer, = await client.exchange(request_packet(mac, MessageType.DISCOVER, extra=extra),
                                   BROADCAST)
    assert offer.message_type is MessageType.OFFER
    ack, = await client.exchange(request_packet(mac, MessageType.REQUEST, xid=offer.xid, extra={
        **extra, Opt.SERVER_ID: offer.server_id.packed,  # type: ignore[union-attr]
        Opt.REQUESTED_IP: offer.yiaddr.packed}), BROADCAST)
    assert ack.message_type is MessageType.ACK and ack.yiaddr == offer.yiaddr
    return ack.yiaddr, [offer, ack]


async def test_uefi_pxe_rom_gets_snponly_and_is_reported(pxe: ScriptedClient,
                                                         served: Served) -> None:
    mac = "52:54:00:77:00:31"
    ip, (offer, ack) = await _dora(pxe, mac, PXE_UEFI_X64)
    for reply in (offer, ack):
        assert reply.siaddr == IPv4Address(SERVER)  # type: ignore[attr-defined]
        assert reply.file == b"snponly.efi"  # type: ignore[attr-defined]
        assert reply.bootfile_name == "snponly.efi"  # type: ignore[attr-defined]
    await asyncio.sleep(0.1)
    assert served.inventory.unknown == [(mac, "uefi_x64")]
    assert (await served.leases.get(mac)).ip == ip  # type: ignore[union-attr]


def _steered_to(part: int, parts: int) -> str:
    """A MAC whose requests the port's reuseport group steers to answerer ``part``."""
    return next(mac for mac in (f"52:54:00:77:01:{n:02x}" for n in range(256))
                if chaddr_index(encode(request_packet(mac, MessageType.DISCOVER)),
                                parts) == part)


class Changes:
    """What the daemon's discovery cache tells the DHCP workers (``Discovery.add_listener``)."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[MacChanges | None], None]] = []

    def add_listener(self, listener: Callable[[MacChanges | None], None]) -> None:
        self.listeners.append(listener)


async def test_worker_processes_serve_known_nodes_and_report_unknown_macs(
        segment: Segment, pxe: ScriptedClient, settings: Settings, store: Store) -> None:
    """``dhcp.workers = 2``: a PXE ROM's DORA is answered by the worker process its MAC is
    steered to; the unknown MAC reaches the daemon's inventory; once the node is enrolled
    and the daemon says its MAC changed, the worker answers with its hostname and binds a
    reservation."""
    mac = _steered_to(2, 3)
    inventory, changes = MemoryInventory(), Changes()
    server = DhcpProcesses(_settings(workers=2), BootSettings(), http_base_url=HTTP,
                           database_url=settings.sqlalchemy_url, inventory=inventory,
                           changes=changes, count=2,
                           leases=LeaseRepo(store.engine, store.boot_pool))
    with entered(segment.server):
        await server.start()
    try:
        assert server.workers is not None and len(server.workers.pids) == 2
        ip, (offer, ack) = await _dora(pxe, mac, PXE_UEFI_X64)
        assert offer.bootfile_name == ack.bootfile_name == "snponly.efi"  # type: ignore[attr-defined]
        for _ in range(250):  # the worker's report, through the daemon's loop
            if inventory.unknown:
                break
            await asyncio.sleep(0.02)
        assert inventory.unknown == [(mac, "uefi_x64")]
        node = await store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname="gpu-35",
                                                macs=(mac,)), actor="test")
        for listener in changes.listeners:  # as the conductor's write makes Discovery do
            listener({mac: None})
        await asyncio.sleep(0.2)
        again, (_offer, ack) = await _dora(pxe, mac, PXE_UEFI_X64)
        assert again == ip and ack.hostname == "gpu-35"  # type: ignore[attr-defined]
        lease = await LeaseRepo(store.engine, store.pool).get(mac)
        assert lease is not None and lease.node_id == node.id and lease.ip == ip
    finally:
        await server.stop()


async def test_the_daemons_loop_answers_its_part_beside_a_worker(
        segment: Segment, pxe: ScriptedClient, settings: Settings, store: Store) -> None:
    """Two answerers, the daemon's loop and one worker process (the 2-CPU default): each
    client is answered by the one its MAC is steered to, from that one's part of the pool
    (the loop: the first half), and both unknown MACs reach the daemon's inventory."""
    macs = {part: _steered_to(part, 2) for part in (0, 1)}
    inventory, changes = MemoryInventory(), Changes()
    leases = LeaseRepo(store.engine, store.boot_pool)
    server = DhcpProcesses(_settings(workers=1), BootSettings(), http_base_url=HTTP,
                           database_url=settings.sqlalchemy_url, inventory=inventory,
                           changes=changes, count=1, leases=leases)
    with entered(segment.server):
        await server.start()
    try:
        assert server.workers is not None and len(server.workers.pids) == 1
        loop_ip, _ = await _dora(pxe, macs[0], PXE_UEFI_X64)
        worker_ip, _ = await _dora(pxe, macs[1], PXE_UEFI_X64)
        assert IPv4Address("10.77.0.100") <= loop_ip <= IPv4Address("10.77.0.149")
        assert IPv4Address("10.77.0.150") <= worker_ip <= IPv4Address("10.77.0.199")
        for _ in range(250):  # the worker's report, through the daemon's loop
            if len(inventory.unknown) == 2:
                break
            await asyncio.sleep(0.02)
        assert sorted(inventory.unknown) == sorted((macs[k], "uefi_x64") for k in (0, 1))
        for part, ip in ((0, loop_ip), (1, worker_ip)):
            assert (await leases.get(macs[part])).ip == ip  # type: ignore[union-attr]
    finally:
        await server.stop()


async def test_ipxe_gets_script_url_and_no_proxydhcp_wait(pxe: ScriptedClient,
                                                          served: Served) -> None:
    mac = "52:54:00:77:00:32"
    _ip, (offer, _ack) = await _dora(pxe, mac, IPXE_BIOS)
    assert offer.bootfile_name == f"{HTTP}/boot/{mac}.ipxe"  # type: ignore[attr-defined]
    assert offer.options[Opt.IPXE_ENCAP] == b"\xb0\x01\x01"  # type: ignore[attr-defined]


async def test_relayed_request_answered_to_relay_with_option_82(segment: Segment,
                                                                served: Served) -> None:
    segment.client.ip("addr", "add", "10.77.0.2/24", "dev", "vc0")
    with entered(segment.client):
        relay = ScriptedClient.bound("10.77.0.2", 67)
    try:
        agent_info = b"\x01\x06rack-7\x02\x04sw12"
        packet = request_packet("52:54:00:77:00:33", MessageType.DISCOVER,
                                giaddr=IPv4Address("10.77.0.2"), broadcast=False,
                                extra={**PXE_UEFI_X64, Opt.RELAY_AGENT_INFO: agent_info})
        offer, = await relay.exchange(packet, (SERVER, 67))
        assert offer.giaddr == IPv4Address("10.77.0.2")
        assert offer.options[Opt.RELAY_AGENT_INFO] == agent_info
        assert list(offer.options)[-1] == Opt.RELAY_AGENT_INFO  # last, RFC 3046
        assert offer.yiaddr != ZERO_IP and offer.bootfile_name == "snponly.efi"
        # A relay from a subnet we have no pool for is ignored.
        stray = request_packet("52:54:00:77:00:34", MessageType.DISCOVER,
                               giaddr=IPv4Address("192.0.2.1"), broadcast=False)
        assert await relay.exchange(stray, (SERVER, 67), wait_s=0.5) == []
    finally:
        relay.close()


async def test_nak_decline_and_inform(segment: Segment, pxe: ScriptedClient,
                                      served: Served) -> None:
    mac = "52:54:00:77:00:35"
    # INIT-REBOOT for an address that is not in our subnet: NAK, broadcast.
    nak, = await pxe.exchange(request_packet(mac, MessageType.REQUEST, extra={
        Opt.REQUESTED_IP: IPv4Address("192.0.2.50").packed}), BROADCAST)
    assert nak.message_type is MessageType.NAK and nak.yiaddr == ZERO_IP
    ip, _ = await _dora(pxe, mac, {})
    # DECLINE: the address is parked; the next DISCOVER gets another one.
    decline = request_packet(mac, MessageType.DECLINE, extra={
        Opt.REQUESTED_IP: ip.packed, Opt.SERVER_ID: IPv4Address(SERVER).packed})
    assert await pxe.exchange(decline, BROADCAST, wait_s=0.3) == []
    other, _ = await _dora(pxe, mac, {})
    assert other != ip
    parked = [lease for lease in await served.leases.all() if lease.ip == ip]
    assert parked[0].state == LeaseState.DECLINED
    # INFORM (from a configured client): options only, unicast back, no lease time.
    segment.client.ip("addr", "add", f"{other}/24", "dev", "vc0")
    inform = request_packet(mac, MessageType.INFORM, ciaddr=other, broadcast=True)
    ack, = await pxe.exchange(inform, BROADCAST)
    assert ack.message_type is MessageType.ACK and ack.yiaddr == ZERO_IP
    assert Opt.LEASE_TIME not in ack.options and ack.subnet_mask == IPv4Address("255.255.255.0")


async def test_unknown_mac_reporting_failure_does_not_block_the_reply(
        pxe: ScriptedClient, served: Served) -> None:
    served.inventory.fail = True
    offer, = await pxe.exchange(request_packet("52:54:00:77:00:36", MessageType.DISCOVER,
                                               extra=PXE_UEFI_X64), BROADCAST)
    assert offer.message_type is MessageType.OFFER


# -- proxy mode beside dnsmasq ------------------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Namespace, Namespace, Namespace]]:
    """S: us on br0 (10.77.0.1); D: dnsmasq, the site's DHCP (10.77.0.2); C: the client."""
    assert shutil.which("dnsmasq"), "dnsmasq-base missing: run scripts/setup.sh"
    ours, dhcp, client = Namespace("pvs"), Namespace("pvd"), Namespace("pvc")
    try:
        ours.ip("link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
        ours.ip("addr", "add", f"{SERVER}/24", "dev", "br0")
        ours.ip("link", "set", "br0", "up")
        for peer, name in ((dhcp, "pd0"), (client, "pc0")):
            veth(ours, name, peer, "eth0")
            ours.ip("link", "set", name, "master", "br0")
        dhcp.ip("addr", "add", "10.77.0.2/24", "dev", "eth0")
        client.ip("link", "set", "eth0", "address", CLIENT_MAC)
        dhcp.popen(["dnsmasq", "-k", "--port=0", "--interface=eth0", "--bind-interfaces",
                    "--dhcp-authoritative", "--user=root", "--no-ping", "--leasefile-ro",
                    "--dhcp-range=10.77.0.50,10.77.0.60,255.255.255.0,1h",
                    f"--log-facility={tmp_path / 'dnsmasq.log'}", "--log-dhcp"])
        yield ours, dhcp, client
    finally:
        client.close()
        dhcp.close()
        ours.close()


async def _wait_udp_listener(ns: Namespace, port: int) -> None:
    async with asyncio.timeout(10):
        while True:
            rc, out = await _run(ns, "ss", "-Hlun", f"sport = :{port}")
            if rc == 0 and out.strip():
                return
            await asyncio.sleep(0.1)


async def test_proxy_mode_beside_dnsmasq(site: tuple[Namespace, Namespace, Namespace],
                                         tmp_path: Path) -> None:
    ours, dhcp, client_ns = site
    inventory = MemoryInventory()
    server = await _serve(ours, _settings(mode="proxy", interface="br0", pool=None),
                          inventory, None)
    await _wait_udp_listener(dhcp, 67)
    with entered(client_ns):
        client = ScriptedClient.bound("0.0.0.0", 68, interface="eth0")
    try:
        discover = request_packet(CLIENT_MAC, MessageType.DISCOVER, extra=PXE_UEFI_X64)
        offers = by_server(await client.exchange(discover, BROADCAST, want=2, wait_s=5))
        site_offer, proxy_offer = offers[IPv4Address("10.77.0.2")], offers[IPv4Address(SERVER)]
        assert IPv4Address("10.77.0.50") <= site_offer.yiaddr <= IPv4Address("10.77.0.60")
        assert proxy_offer.yiaddr == ZERO_IP and Opt.LEASE_TIME not in proxy_offer.options
        assert proxy_offer.vendor_class == "PXEClient"
        assert proxy_offer.siaddr == IPv4Address(SERVER) and proxy_offer.file == b"snponly.efi"
        assert proxy_offer.options[Opt.CLIENT_UUID] == PXE_UEFI_X64[Opt.CLIENT_UUID]
        # The client takes the site's address, then asks us on 4011 (PXE "BINL" request).
        client_ns.ip("addr", "add", f"{site_offer.yiaddr}/24", "dev", "eth0")
        ask = request_packet(CLIENT_MAC, MessageType.REQUEST, ciaddr=site_offer.yiaddr,
                             broadcast=False, extra={**PXE_UEFI_X64,
                                                     Opt.SERVER_ID: ips(IPv4Address(SERVER))})
        ack, = await client.exchange(ask, (SERVER, 4011))
        assert ack.message_type is MessageType.ACK and ack.bootfile_name == "snponly.efi"
        assert inventory.unknown == [(CLIENT_MAC, "uefi_x64")]
        # An OS DHCP client (no PXE fingerprint) hears only the site's server.
        plain = request_packet("52:54:00:77:00:41", MessageType.DISCOVER)
        only = await client.exchange(plain, BROADCAST, want=2, wait_s=2)
        assert [reply.server_id for reply in only] == [IPv4Address("10.77.0.2")]
    finally:
        client.close()
        await server.stop()
