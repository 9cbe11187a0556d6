"""UDP sockets for the boot servers (broadcast, bound to a device), the loop's reader of
them, and ARP entries."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
from collections.abc import Callable
from ipaddress import IPv4Address
from typing import Any

log = logging.getLogger(__name__)

_SIOCSARP = 0x8955
_ATF_COM = 0x02  # completed entry
_ARPHRD_ETHER = 1
_RCVBUF_BYTES = 4 * 1024 * 1024
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux
READ_BATCH = 64  # datagrams read per wake-up of the loop
_MAX_DATAGRAM = 65_535

Address = tuple[str, int]


def udp_socket(host: str, port: int, *, interface: str | None = None,
               broadcast: bool = False, reuse: bool = True,
               reuse_port: bool = False) -> socket.socket:
    """A bound, non-blocking UDP socket; SO_BINDTODEVICE when ``interface`` is set,
    SO_REUSEPORT with ``reuse_port`` (``reuseport.py``). A large receive buffer absorbs
    bursts (1,000 clients booting at once)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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


class DatagramSocket:
    """A bound UDP socket read from the event loop's selector directly: every datagram
    waiting is handed to ``on_datagram(data, source, self)`` in one wake-up (asyncio's
    datagram transport reads one each time the selector reports the socket, so in a boot
    storm each packet paid a whole loop iteration), and ``sendto`` sends at once (a full
    socket buffer drops the datagram, as the network may: clients retransmit)."""

    def __init__(self, sock: socket.socket,
                 on_datagram: Callable[[bytes, Address, DatagramSocket], None]) -> None:
        self._sock, self._on_datagram = sock, on_datagram
        self._name = sock.getsockname()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        for _ in range(READ_BATCH):
            if self._sock.fileno() < 0:  # closed by what the last datagram started
                return
            try:
                data, source = self._sock.recvfrom(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. an ICMP error queued for the socket
                log.debug("UDP %s: %s", self._name, exc)
                continue
            self._on_datagram(data, source, self)

    def sendto(self, data: bytes, addr: Address) -> None:
        try:
            self._sock.sendto(data, addr)
        except OSError as exc:
            log.debug("UDP: sending to %s failed: %s", addr[0], exc)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """What an asyncio transport tells: ``socket`` and ``sockname``."""
        if name == "socket":
            return self._sock
        if name == "sockname":
            return self._sock.getsockname()
        return default

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()


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
