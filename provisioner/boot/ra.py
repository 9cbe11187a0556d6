"""Answers IPv6 Router Solicitations on the boot interface with a bare Router Advertisement.

iPXE waits ~13 s for an RA before it gives up on IPv6 (PEERS.md §2); an RA with no prefix,
no M/O flags and router lifetime 0 ends that wait at once and announces no IPv6 router.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

log = logging.getLogger(__name__)

ICMPV6_RS = 133
ICMPV6_RA = 134
ALL_NODES = "ff02::1"
ALL_ROUTERS = "ff02::2"


def router_advertisement(mac: bytes | None = None) -> bytes:
    """ICMPv6 RA: hop limit 64, no flags, lifetime 0 (not a default router), no prefixes.
    The kernel fills in the checksum of a raw ICMPv6 socket."""
    body = struct.pack("!BBHBBHII", ICMPV6_RA, 0, 0, 64, 0, 0, 0, 0)
    if mac is not None and len(mac) == 6:
        body += struct.pack("!BB", 1, 1) + mac  # source link-layer address option
    return body


def _filter_only(icmp_type: int) -> bytes:
    """ICMP6_FILTER: block every type but ``icmp_type`` (RFC 3542 bit semantics)."""
    words = [0xFFFFFFFF] * 8
    words[icmp_type >> 5] &= ~(1 << (icmp_type & 31))
    return struct.pack("8I", *words)


class RouterAdvertiser:
    def __init__(self, interface: str) -> None:
        self._interface = interface
        self._sock: socket.socket | None = None
        self._answered = 0

    async def start(self) -> None:
        index = socket.if_nametoindex(self._interface)
        sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self._interface.encode())
        sock.setsockopt(socket.IPPROTO_ICMPV6, 1, _filter_only(ICMPV6_RS))  # ICMP6_FILTER
        group = socket.inet_pton(socket.AF_INET6, ALL_ROUTERS) + struct.pack("@I", index)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, group)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
        sock.setblocking(False)
        self._sock = sock
        self._mac = _interface_mac(self._interface)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._on_readable)
        log.info("answering IPv6 router solicitations on %s", self._interface)

    async def stop(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _on_readable(self) -> None:
        assert self._sock is not None
        try:
            data, (source, *_rest) = self._sock.recvfrom(1500)
        except OSError as exc:
            log.debug("router solicitation receive failed: %s", exc)
            return
        if len(data) < 8 or data[0] != ICMPV6_RS:
            return
        try:
            self._sock.sendto(router_advertisement(self._mac), (ALL_NODES, 0))
        except OSError as exc:
            log.warning("cannot send a router advertisement on %s: %s", self._interface, exc)
            return
        self._answered += 1
        log.debug("router advertisement sent on %s for %s", self._interface, source)


def _interface_mac(interface: str) -> bytes | None:
    try:
        with open(f"/sys/class/net/{interface}/address") as fh:
            return bytes.fromhex(fh.read().strip().replace(":", ""))
    except (OSError, ValueError):
        return None
