"""The DHCPv4 server: datagram -> DhcpPacket -> BootRequest -> policy + leases -> reply.

Modes (``dhcp.mode``): ``authoritative`` hands out addresses from the pool (leases in the
store, known nodes' addresses reserved) with boot options for network-booting clients;
``proxy`` answers only network-booting clients, beside the site's DHCP, on the server port
(ProxyDHCP offers without an address) and on ``proxy_port`` (4011, PXE/iPXE requests);
``off`` runs nothing. The datagram handler never raises: a malformed packet is a DEBUG line
and a counted drop (a WARNING summary at most once a minute). Lapsed leases are marked
expired by the fleet's expiry sweep (``lifecycle/sweeps.py``, on the daemon leading the
singletons), not by each server.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from typing import Any, Protocol

from provisioner.boot import dhcp_reply as replies
from provisioner.boot.dhcp_codec import (
    BOOTP_MIN_SIZE,
    DhcpPacket,
    DhcpParseError,
    MessageType,
    Op,
    encode,
    parse,
)
from provisioner.boot.flood import PerKeyLimit
from provisioner.boot.inventory import BootInventory, KnownNode, UnknownReports
from provisioner.boot.policy import BootReply, BootRequest, boot_reply, ipxe_script_url
from provisioner.boot.reuseport import chaddr_index
from provisioner.boot.sockets import DatagramSocket, add_arp_entry, udp_socket
from provisioner.config import BootSettings, DhcpSettings
from provisioner.errors import ConfigError
from provisioner.store.leases import AddressRange, DeclineOutcome, Holder, LeaseRepo
from provisioner.tasks import TaskSet

log = logging.getLogger(__name__)

OFFER_HOLD_S = 60.0  # an offered address is kept for the client's REQUEST this long
MAX_IN_FLIGHT = 1024  # requests being answered at once; more are dropped (clients retry)
PER_MAC_RATE_PER_S, PER_MAC_BURST, PER_MAC_IN_FLIGHT = 5.0, 20, 4  # one MAC's share
_SUMMARY_INTERVAL_S = 60.0


class DatagramPort(Protocol):
    """Where a request came in and its reply goes out (a ``DatagramSocket``; tests pass
    their own)."""

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class DhcpServer:
    def __init__(self, settings: DhcpSettings, boot: BootSettings, *, http_base_url: str,
                 inventory: BootInventory, leases: LeaseRepo | None,
                 clock: Callable[[], float] = time.monotonic,
                 part: tuple[int, int] | None = None) -> None:
        """``part``: (slot, count) of a worker process (``dhcp_worker.py``): new clients
        get addresses from that part of the pool only."""
        self._settings = settings
        self._boot = boot
        self._http_base_url = http_base_url
        self._inventory = inventory
        self._leases = leases
        self._clock = clock
        self._server_id = IPv4Address(0)
        self._range: AddressRange | None = None
        self._fresh: AddressRange | None = None  # where new clients' addresses come from
        self._part = part
        self._network: replies.Network | None = None
        self._ports = replies.Ports(client=68 if settings.port == 67 else settings.port + 1,
                                    relay=settings.port)
        if settings.mode != "off":
            self._configure(settings)
        self._sockets: list[DatagramSocket] = []
        self._handlers = TaskSet()
        # one MAC's share: DORA, the proxy exchange and iPXE's own DORA fit in the burst
        self._per_mac = PerKeyLimit(rate_per_s=PER_MAC_RATE_PER_S, burst=PER_MAC_BURST,
                                    max_in_flight=PER_MAC_IN_FLIGHT, clock=clock)
        self._unknown = UnknownReports(inventory, MAX_IN_FLIGHT)
        self._drops: dict[str, int] = {}
        self._last_summary = 0.0
        self._arp_failed = False

    def _configure(self, settings: DhcpSettings) -> None:
        if settings.server_address is None:
            raise ConfigError(f"dhcp.server_address is required in {settings.mode} mode")
        self._server_id = IPv4Address(settings.server_address)
        if settings.mode != "authoritative":
            return
        if settings.pool is None or self._leases is None:
            raise ConfigError("dhcp.pool (and the lease store) are required in "
                              "authoritative mode")
        self._range = AddressRange.parse(settings.pool, settings.netmask)
        if self._part is not None:
            self._fresh = self._range.part(*self._part)
        self._network = replies.Network(
            server_id=self._server_id, netmask=IPv4Address(settings.netmask),
            lease_time_s=settings.lease_time_s,
            router=IPv4Address(settings.router) if settings.router else None,
            dns_servers=tuple(IPv4Address(a) for a in settings.dns_servers),
            domain_name=settings.domain_name)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind (0.0.0.0:port, and proxy_port in proxy mode); raise OSError if a port is
        taken. Nothing happens in mode ``off``."""
        mode = self._settings.mode
        if mode == "off":
            return
        ports = [self._settings.port]
        if mode == "proxy":
            ports.append(self._settings.proxy_port)
        for port in ports:
            sock = udp_socket("0.0.0.0", port, interface=self._settings.interface,
                              broadcast=True)
            self._sockets.append(DatagramSocket(sock, self._receiver(port)))
        log.info("DHCP %s on %s port %s (server id %s)", mode,
                 self._settings.interface or "all interfaces",
                 "/".join(map(str, ports)), self._server_id)

    def serve_on(self, sock: socket.socket) -> None:
        """Answer what reaches ``sock``, bound by the daemon (a worker process's member of
        the port's reuseport group), as the server port's socket."""
        self._sockets.append(DatagramSocket(sock, self._receiver(self._settings.port)))

    async def stop(self) -> None:
        for bound in self._sockets:
            bound.close()
        self._sockets.clear()
        await self._handlers.cancel_all()
        await self._unknown.stop()

    def _receiver(self, port: int) -> Callable[[bytes, tuple[str, int], DatagramSocket], None]:
        return lambda data, addr, bound: self.received(data, addr, port, bound)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound (host, port) pairs, for tests and the startup log."""
        return [bound.get_extra_info("sockname") for bound in self._sockets]

    # -- receiving --------------------------------------------------------------------------

    def received(self, data: bytes, addr: tuple[str, int], port: int,
                 transport: DatagramPort) -> None:
        """The datagram handler: decode here, answer in a task. Never raises."""
        if self._part is not None and chaddr_index(data, self._part[1]) != self._part[0]:
            return  # a broadcast reaches every worker's socket: the client's worker answers
        try:
            packet = parse(data)
            request = replies.boot_request(packet)
        except DhcpParseError as exc:
            self._drop(f"malformed: {exc.reason}", addr)
            return
        except Exception:  # a bug must not kill the endpoint
            log.exception("DHCP: decoding a packet from %s failed", addr[0])
            return
        if packet.op != Op.BOOTREQUEST:
            return
        if len(self._handlers) >= MAX_IN_FLIGHT:
            self._drop("overloaded", addr)
            return
        if (refused := self._per_mac.admit(request.mac)) is not None:
            self._drop(refused, addr)
            return
        self._handlers.spawn(self._answer(packet, request, addr, port, transport),
                             name="dhcp-request")

    async def _answer(self, packet: DhcpPacket, request: BootRequest, addr: tuple[str, int],
                      port: int, transport: DatagramPort) -> None:
        try:
            if self._settings.mode == "proxy":
                reply = await self._proxy(packet, request, port == self._settings.proxy_port)
            else:
                reply = await self._authoritative(packet, request)
            if reply is not None:
                self._send(transport, packet, reply, addr, port)
        except DhcpParseError as exc:
            self._drop(f"malformed: {exc.reason}", addr)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("DHCP: answering %s from %s failed", request.mac, addr[0])
        finally:
            self._per_mac.done(request.mac)

    def _drop(self, reason: str, addr: tuple[str, int]) -> None:
        log.debug("DHCP: dropped a packet from %s: %s", addr[0], reason)
        self._drops[reason] = self._drops.get(reason, 0) + 1
        now = self._clock()
        if now - self._last_summary >= _SUMMARY_INTERVAL_S:
            self._last_summary = now
            summary = ", ".join(f"{n}x {why}" for why, n in sorted(self._drops.items()))
            self._drops.clear()
            log.warning("DHCP: dropped packets in the last minute: %s", summary)

    # -- policy -----------------------------------------------------------------------------

    async def _lookup(self, request: BootRequest) -> tuple[KnownNode | None, BootReply | None]:
        # the inventory caches (the daemon's Discovery: known nodes until their next
        # transition, unknown MACs for a TTL, a burst's misses in one read)
        known = await self._inventory.lookup(request.mac)
        boot = boot_reply(
            request, known is not None,
            ipxe_script_url=ipxe_script_url(self._http_base_url, request.mac),
            tftp_server=str(self._server_id), http_base_url=self._http_base_url,
            arm64_bootfile=self._boot.arm64_bootfile)
        if boot is not None and known is None and request.message_type == MessageType.DISCOVER:
            self._unknown.report(request.mac, boot.client_class)
        return known, boot

    async def _proxy(self, packet: DhcpPacket, request: BootRequest,
                     on_proxy_port: bool) -> DhcpPacket | None:
        kind = request.message_type
        wanted = (MessageType.REQUEST, MessageType.INFORM) if on_proxy_port else (
            MessageType.DISCOVER,)
        if kind not in wanted or not request.is_network_boot:
            return None
        _known, boot = await self._lookup(request)
        if boot is None:
            return None
        answer = MessageType.ACK if on_proxy_port else MessageType.OFFER
        log.info("DHCP proxy: %s (%s) gets %s", request.mac, boot.client_class,
                 boot.bootfile_name)
        return replies.proxy_reply(packet, answer, self._server_id, boot)

    # -- authoritative ------------------------------------------------------------------------

    async def _authoritative(self, packet: DhcpPacket,
                             request: BootRequest) -> DhcpPacket | None:
        assert self._range is not None and self._network is not None
        if packet.relayed and packet.giaddr not in self._range.network:
            self._drop(f"relay {packet.giaddr} outside {self._range.network}", (
                str(packet.giaddr), 0))
            return None
        kind = request.message_type
        if kind == MessageType.RELEASE:
            await self._lease_repo().release(request.mac, packet.ciaddr)
            log.info("DHCP: %s released %s", request.mac, packet.ciaddr)
            return None
        if kind == MessageType.DECLINE:
            await self._decline(packet, request)
            return None
        if kind not in (MessageType.DISCOVER, MessageType.REQUEST, MessageType.INFORM):
            return None
        known, boot = await self._lookup(request)
        hostname = known.hostname if known is not None else None
        if kind == MessageType.INFORM:
            return replies.lease_reply(packet, MessageType.ACK, packet.ciaddr, self._network,
                                       hostname=hostname, boot=boot)
        holder = Holder(request.mac, known.node_id if known else None, hostname,
                        _client_id(packet))
        if kind == MessageType.DISCOVER:
            return await self._offer(packet, holder, boot)
        return await self._request(packet, holder, boot)

    def _lease_repo(self) -> LeaseRepo:
        assert self._leases is not None
        return self._leases

    async def _offer(self, packet: DhcpPacket, holder: Holder,
                     boot: BootReply | None) -> DhcpPacket | None:
        assert self._range is not None and self._network is not None
        lease = await self._lease_repo().offer(holder, self._range, hold_s=OFFER_HOLD_S,
                                               requested=_safe_requested(packet),
                                               fresh=self._fresh)
        if lease is None:
            self._drop(f"pool {self._settings.pool} exhausted", ("0.0.0.0", 0))
            return None
        return replies.lease_reply(packet, MessageType.OFFER, lease.ip, self._network,
                                   hostname=holder.hostname, boot=boot)

    async def _request(self, packet: DhcpPacket, holder: Holder,
                       boot: BootReply | None) -> DhcpPacket | None:
        assert self._range is not None and self._network is not None
        server_id = packet.server_id
        if server_id is not None and server_id != self._server_id:
            # the client chose another server: its offer (in memory) is withdrawn; a binding,
            # which another server on the segment may just have made, is never touched
            await self._lease_repo().forget_offer(holder.mac)
            return None
        renewing = server_id is None and packet.requested_ip is None
        ip = packet.ciaddr if renewing else packet.requested_ip
        if ip is None or int(ip) == 0:
            return None
        repo = self._lease_repo()
        lease = await (repo.renew if renewing else repo.bind)(
            holder, ip, self._range, lease_time_s=self._settings.lease_time_s)
        if lease is None:
            log.info("DHCP: NAK %s for %s (not its address)", holder.mac, ip)
            return replies.nak(packet, self._server_id, f"{ip} is not yours")
        log.log(logging.DEBUG if renewing else logging.INFO, "DHCP: %s %s to %s%s",
                "renewed" if renewing else "bound", ip, holder.mac,
                f", boot file {boot.bootfile_name}" if boot else "")
        left = repo.seconds_left(lease)  # less than a lease time for a cached renewal
        return replies.lease_reply(packet, MessageType.ACK, lease.ip, self._network,
                                   lease_time_s=min(self._settings.lease_time_s, left),
                                   hostname=holder.hostname, boot=boot)

    async def _decline(self, packet: DhcpPacket, request: BootRequest) -> None:
        """RFC 2131: a DECLINE names the address (option 50) and this server (option 54,
        a MUST). Anyone can send one with any ``chaddr``: only a dynamic address bound to
        that client is parked; a known node's reservation is never touched
        (``LeaseRepo.decline``), the refusal is counted in the drop summary."""
        ip = _safe_requested(packet)
        if ip is None or packet.server_id != self._server_id:
            self._drop("DECLINE without this server's id or an address", ("0.0.0.0", 0))
            return
        if await self._inventory.lookup(request.mac) is not None:
            outcome = DeclineOutcome.RESERVED  # a node's lease, even one bound before it was
        else:  # known: what its agent token is bound to
            outcome = await self._lease_repo().decline(
                request.mac, ip, client_id=_client_id(packet),
                hold_s=self._settings.decline_hold_s)
        if outcome is DeclineOutcome.DECLINED:
            log.warning("DHCP: %s declined %s (in use by another host); held for %s s",
                        request.mac, ip, self._settings.decline_hold_s)
        elif outcome is DeclineOutcome.RESERVED:
            self._drop("DECLINE of a known node's reserved address ignored", ("0.0.0.0", 0))
        else:
            self._drop("DECLINE of an address not bound to that client ignored",
                       ("0.0.0.0", 0))

    # -- sending ------------------------------------------------------------------------------

    def _send(self, transport: DatagramPort, request: DhcpPacket,
              reply: DhcpPacket, addr: tuple[str, int], port: int) -> None:
        if port == self._settings.proxy_port and self._settings.mode == "proxy":
            target = (addr[0], addr[1])  # PXE port 4011: answer where it came from
        else:
            dest = replies.destination(request, reply, self._ports)
            if dest.via_mac is not None and not self._arp(transport, dest):
                dest = replies.Destination(replies.BROADCAST_IP, dest.port)
            target = (str(dest.ip), dest.port)
        log.debug("DHCP: %s -> %s:%s", reply.message_type, *target)
        transport.sendto(encode(reply, min_size=BOOTP_MIN_SIZE), target)

    def _arp(self, transport: DatagramPort, dest: replies.Destination) -> bool:
        """Teach the kernel yiaddr -> chaddr so a unicast reaches a client with no address."""
        if self._arp_failed or self._settings.interface is None or dest.via_mac is None:
            return False
        sock = transport.get_extra_info("socket")
        try:
            add_arp_entry(sock.fileno(), self._settings.interface, dest.ip, dest.via_mac)
        except OSError as exc:
            self._arp_failed = True
            log.warning("DHCP: cannot add ARP entries (%s); replies are broadcast", exc)
            return False
        return True


def _safe_requested(packet: DhcpPacket) -> IPv4Address | None:
    try:
        return packet.requested_ip
    except DhcpParseError:
        return None


def _client_id(packet: DhcpPacket) -> str | None:
    raw = packet.client_id
    return raw.hex() if raw is not None and len(raw) <= 127 else None

