"""Test doubles for the DHCP server: an in-memory BootInventory and a scripted DHCP client
(PXE ROM, iPXE, relay) built on the project's codec, speaking over a real UDP socket."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from provisioner.boot.dhcp_codec import (
    BROADCAST_FLAG,
    ZERO_IP,
    DhcpPacket,
    DhcpParseError,
    MessageType,
    Op,
    Opt,
    encode,
    parse,
    u8,
    u16,
)
from provisioner.boot.inventory import KnownNode

PXE_UEFI_X64: dict[int, bytes] = {Opt.VENDOR_CLASS: b"PXEClient:Arch:00007:UNDI:003000",
                Opt.CLIENT_ARCH: u16(7), Opt.CLIENT_NDI: b"\x01\x03\x00",
                Opt.CLIENT_UUID: b"\x00" + bytes(range(16))}
PXE_BIOS: dict[int, bytes] = {Opt.VENDOR_CLASS: b"PXEClient:Arch:00000:UNDI:002001",
            Opt.CLIENT_ARCH: u16(0), Opt.CLIENT_NDI: b"\x01\x02\x01"}
IPXE_BIOS: dict[int, bytes] = {**PXE_BIOS, Opt.USER_CLASS: b"iPXE",
             Opt.IPXE_ENCAP: b"\xb1\x05\x01\x1a\xf4\x10\x00\xeb\x03\x01\x00\x00"}


@dataclass
class MemoryInventory:
    """BootInventory over a dict; records the unknown MACs that booted."""

    known: dict[str, KnownNode] = field(default_factory=dict)
    unknown: list[tuple[str, str]] = field(default_factory=list)
    fail: bool = False

    async def lookup(self, mac: str) -> KnownNode | None:
        return self.known.get(mac)

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        if self.fail:
            raise RuntimeError("inventory is down")
        self.unknown.append((mac, client))


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0")


def request_packet(mac: str, kind: MessageType, *, xid: int | None = None,
                   extra: dict[int, bytes] | None = None, ciaddr: IPv4Address = ZERO_IP,
                   giaddr: IPv4Address = ZERO_IP, broadcast: bool = True) -> DhcpPacket:
    options: dict[int, bytes] = {Opt.MESSAGE_TYPE: u8(kind)}
    options.update(extra or {})
    return DhcpPacket(op=Op.BOOTREQUEST, xid=random.getrandbits(32) if xid is None else xid,
                      chaddr=mac_bytes(mac), ciaddr=ciaddr, giaddr=giaddr,
                      hops=1 if giaddr != ZERO_IP else 0,
                      flags=BROADCAST_FLAG if broadcast else 0, options=options)


class ScriptedClient:
    """A UDP socket (made by the caller, e.g. inside a namespace) that sends DHCP requests
    and collects the replies with a matching xid."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock

    @classmethod
    def bound(cls, host: str, port: int, *, interface: str | None = None) -> ScriptedClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        if interface is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        sock.bind((host, port))
        return cls(sock)

    def close(self) -> None:
        self.sock.close()

    async def exchange(self, packet: DhcpPacket, to: tuple[str, int], *,
                       wait_s: float = 1.5, want: int = 1) -> list[DhcpPacket]:
        """Send ``packet``; return the replies (same xid) seen within ``wait_s`` or once
        ``want`` of them arrived."""
        loop = asyncio.get_running_loop()
        await loop.sock_sendto(self.sock, encode(packet), to)
        replies: list[DhcpPacket] = []
        try:
            async with asyncio.timeout(wait_s):
                while len(replies) < want:
                    data, _ = await loop.sock_recvfrom(self.sock, 4096)
                    try:
                        reply = parse(data)
                    except DhcpParseError:
                        continue
                    if reply.op == Op.BOOTREPLY and reply.xid == packet.xid:
                        replies.append(reply)
        except TimeoutError:
            pass
        return replies


def by_server(replies: Iterable[DhcpPacket]) -> dict[IPv4Address | None, DhcpPacket]:
    return {reply.server_id: reply for reply in replies}
