"""DHCP request -> BootRequest, and the replies the server sends. Pure: no sockets, no loop.

``destination`` implements RFC 2131 §4.1's rules for where a reply goes: to the relay
(giaddr, server port), else NAKs broadcast, else to a configured client (ciaddr), else
broadcast when the client asks for it, else unicast to yiaddr at chaddr.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from ipaddress import IPv4Address

from provisioner.boot.dhcp_codec import (
    BROADCAST_FLAG,
    ZERO_IP,
    DhcpPacket,
    DhcpParseError,
    MessageType,
    Op,
    Opt,
    ips,
    text,
    u8,
    u32,
)
from provisioner.boot.policy import IPXE_USER_CLASS, BootReply, BootRequest, ClientClass

BROADCAST_IP = IPv4Address("255.255.255.255")
# Option 43 for ProxyDHCP offers: PXE_DISCOVERY_CONTROL (6) = 8, "boot the file named in
# this offer, no boot-server discovery" (PXE 2.1 §2.4.5), then the end marker.
PXE_DISCOVERY_CONTROL = b"\x06\x01\x08\xff"


@dataclass(frozen=True, slots=True)
class Network:
    """What every address-granting reply carries (authoritative mode)."""

    server_id: IPv4Address
    netmask: IPv4Address
    lease_time_s: int
    router: IPv4Address | None = None
    dns_servers: tuple[IPv4Address, ...] = ()
    domain_name: str | None = None


@dataclass(frozen=True, slots=True)
class Destination:
    ip: IPv4Address
    port: int
    via_mac: str | None = None  # unicast to a client with no address yet: needs an ARP entry


@dataclass(frozen=True, slots=True)
class Ports:
    client: int = 68
    relay: int = 67  # relays listen on the server port


def boot_request(packet: DhcpPacket) -> BootRequest:
    """What the policy sees of ``packet``; DhcpParseError when a needed field is bad."""
    mac = packet.mac
    if mac is None:
        raise DhcpParseError(f"hardware type {packet.htype}/{packet.hlen} is not Ethernet")
    message_type = packet.message_type
    if message_type is None:
        raise DhcpParseError("no valid message type (option 53)")
    arches = packet.client_arches
    classes = packet.user_classes
    user_class = None
    if classes:
        wanted = IPXE_USER_CLASS.encode()
        user_class = (wanted if wanted in classes else classes[0]).decode("latin-1")
    return BootRequest(
        mac=mac, message_type=int(message_type), client_arch=arches[0] if arches else None,
        vendor_class=packet.vendor_class, user_class=user_class,
        ipxe_options=Opt.IPXE_ENCAP in packet.options,
        giaddr=str(packet.giaddr) if packet.relayed else None)


def _reply(request: DhcpPacket, kind: MessageType, options: dict[int, bytes],
           boot: BootReply | None, *, yiaddr: IPv4Address = ZERO_IP,
           ciaddr: IPv4Address = ZERO_IP, flags: int | None = None) -> DhcpPacket:
    """The reply to ``request``: the message type, ``options``, the boot options, then
    option 82 echoed last (RFC 3046 §2.2). Built once: a packet per reply, no copies."""
    merged: dict[int, bytes] = {Opt.MESSAGE_TYPE: u8(kind)}
    merged.update(options)
    siaddr, file = ZERO_IP, b""
    if boot is not None:
        if boot.vendor_class is not None:
            merged[Opt.VENDOR_CLASS] = text(boot.vendor_class)
        if boot.next_server is not None:
            siaddr = IPv4Address(boot.next_server)
            merged[Opt.TFTP_SERVER_NAME] = text(boot.next_server)
        name = text(boot.bootfile_name)
        merged[Opt.BOOTFILE_NAME] = name
        file = name if len(name) < 128 else b""
        merged.update(boot.extra_options)
    relay_info = request.options.get(Opt.RELAY_AGENT_INFO)
    if relay_info is not None:
        merged[Opt.RELAY_AGENT_INFO] = relay_info
    return DhcpPacket(op=Op.BOOTREPLY, xid=request.xid, chaddr=request.chaddr,
                      htype=request.htype, hlen=request.hlen,
                      flags=request.flags if flags is None else flags, ciaddr=ciaddr,
                      yiaddr=yiaddr, siaddr=siaddr, giaddr=request.giaddr, file=file,
                      options=merged)


def lease_reply(request: DhcpPacket, kind: MessageType, yiaddr: IPv4Address, net: Network,
                *, lease_time_s: int | None = None, hostname: str | None = None,
                boot: BootReply | None = None) -> DhcpPacket:
    """OFFER or ACK granting ``yiaddr`` (or an INFORM's ACK with ``yiaddr`` 0, no lease)."""
    inform = request.message_type is MessageType.INFORM
    options: dict[int, bytes] = {Opt.SERVER_ID: net.server_id.packed}
    if not inform:
        seconds = net.lease_time_s if lease_time_s is None else lease_time_s
        options[Opt.LEASE_TIME] = u32(seconds)
        options[Opt.RENEWAL_TIME] = u32(seconds // 2)
        options[Opt.REBINDING_TIME] = u32(seconds * 7 // 8)
    options[Opt.SUBNET_MASK] = net.netmask.packed
    if net.router is not None:
        options[Opt.ROUTER] = net.router.packed
    if net.dns_servers:
        options[Opt.DNS_SERVERS] = ips(*net.dns_servers)
    if net.domain_name:
        options[Opt.DOMAIN_NAME] = text(net.domain_name)
    if hostname:
        options[Opt.HOSTNAME] = text(hostname)
    return _reply(request, kind, options, boot, yiaddr=ZERO_IP if inform else yiaddr,
                  ciaddr=request.ciaddr)


def nak(request: DhcpPacket, server_id: IPv4Address, message: str) -> DhcpPacket:
    flags = request.flags | BROADCAST_FLAG if request.relayed else request.flags
    options: dict[int, bytes] = {Opt.SERVER_ID: server_id.packed, Opt.MESSAGE: text(message)}
    return _reply(request, MessageType.NAK, options, None, flags=flags)


def proxy_reply(request: DhcpPacket, kind: MessageType, server_id: IPv4Address,
                boot: BootReply) -> DhcpPacket:
    """ProxyDHCP OFFER (port 67) or ACK (port 4011): boot options only, no address."""
    options: dict[int, bytes] = {Opt.SERVER_ID: server_id.packed}
    http = boot.client_class in (ClientClass.UEFI_HTTP_X64, ClientClass.UEFI_HTTP_ARM64)
    options[Opt.VENDOR_CLASS] = b"HTTPClient" if http else b"PXEClient"
    if not http:
        options[Opt.VENDOR_SPECIFIC] = PXE_DISCOVERY_CONTROL
    uuid = request.options.get(Opt.CLIENT_UUID)
    if uuid is not None:
        options[Opt.CLIENT_UUID] = uuid
    return _reply(request, kind, options, replace(boot, vendor_class=None),
                  ciaddr=request.ciaddr)


def destination(request: DhcpPacket, reply: DhcpPacket, ports: Ports = Ports()) -> Destination:
    """Where ``reply`` goes (RFC 2131 §4.1)."""
    if request.relayed:
        return Destination(request.giaddr, ports.relay)
    if reply.message_type is MessageType.NAK:
        return Destination(BROADCAST_IP, ports.client)
    if request.ciaddr != ZERO_IP:
        return Destination(request.ciaddr, ports.client)
    if request.broadcast or reply.yiaddr == ZERO_IP or request.mac is None:
        return Destination(BROADCAST_IP, ports.client)
    return Destination(reply.yiaddr, ports.client, via_mac=request.mac)

