"""UDP sockets for the boot servers (broadcast, bound to a device) and ARP entries."""

from __future__ import annotations

import fcntl
import logging
import socket
import struct
from ipaddress import IPv4Address

log = logging.getLogger(__name__)

_SIOCSARP = 0x8955
_ATF_COM = 0x02  # completed entry
_ARPHRD_ETHER = 1
_RCVBUF_BYTES = 4 * 1024 * 1024
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux


def udp_socket(host: str, port: int, *, interface: str | None = None,
               broadcast: bool = False, reuse: bool = True) -> socket.socket:
    """A bound, non-blocking UDP socket; SO_BINDTODEVICE when ``interface`` is set.
    A large receive buffer absorbs bursts (1,000 clients booting at once)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if broadcast:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        if interface is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        _grow_receive_buffer(sock)
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _grow_receive_buffer(sock: socket.socket) -> None:
    try:  # beyond net.core.rmem_max needs CAP_NET_ADMIN
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _RCVBUF_BYTES)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF_BYTES)


def add_arp_entry(fd: int, interface: str, ip: IPv4Address, mac: str) -> None:
    """ioctl(SIOCSARP): ``ip`` is at ``mac`` on ``interface`` (what dnsmasq does to unicast
    an OFFER to a client that has no address yet). Needs CAP_NET_ADMIN; raises OSError."""
    protocol_addr = struct.pack("=H2s4s8x", socket.AF_INET, b"\0\0", ip.packed)
    hardware_addr = struct.pack("=H6s8x", _ARPHRD_ETHER, bytes.fromhex(mac.replace(":", "")))
    request = (protocol_addr + hardware_addr + struct.pack("=i", _ATF_COM) + bytes(16)
               + interface.encode()[:15].ljust(16, b"\0"))
    fcntl.ioctl(fd, _SIOCSARP, request)
