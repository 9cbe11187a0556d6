"""One UDP port served by several processes: a group of ``SO_REUSEPORT`` sockets bound to
it, and a classic BPF program that steers each datagram to a socket by its source
address, so that every request from one address reaches the same process (TFTP: its limits
count all of that address's transfers, and a retransmitted request finds its transfer), or
by a DHCP request's client hardware address (``chaddr``: a relay's requests all come from
one address, and every request of one client must reach the process holding its offer).

The kernel numbers a group's sockets in the order they were bound; the program returns a
hash of the source address (or of ``chaddr`` bytes 2-5) modulo the socket count
(``steer_index`` and ``chaddr_index`` compute the same in Python). The hash mixes every
bit of the address: a plain ``address % count`` would send every client whose addresses
end alike (``10.0.k.2``) to one socket. An index past the
group's end (a socket closed) falls back to the kernel's own hash, so a shrunken group
still delivers everything.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from typing import Literal

from provisioner.boot.sockets import udp_socket

Steer = Literal["source", "chaddr"]

SO_ATTACH_REUSEPORT_CBPF = 51  # Linux, include/uapi/asm-generic/socket.h
_SKF_NET_OFF = -0x100000  # loads relative to the network header
_IPV4_SOURCE = 12  # offset of the source address in the IPv4 header
_CHADDR_WORD = 30  # BOOTP chaddr bytes 2-5 (the program sees the UDP payload from 0);
# bytes 0-1 are the vendor's OUI head, alike for a whole rack
_MIX = 0x45D9F3B  # an odd multiplier that spreads each input bit over the word

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;}
_LD_W_ABS, _TAX, _RSH_K, _XOR_X, _MUL_K, _MOD_K, _RET_A = (
    0x20, 0x07, 0x74, 0xAC, 0x24, 0x94, 0x16)
_INSN = struct.Struct("=HBBI")


def _mix(a: int, count: int) -> int:
    a ^= a >> 16
    a = (a * _MIX) & 0xFFFFFFFF
    a ^= a >> 16
    return a % count


def steer_index(address: str, count: int) -> int:
    """The socket an IPv4 source address is steered to: what the program computes."""
    return _mix(int(ipaddress.IPv4Address(address)), count)


def chaddr_index(datagram: bytes, count: int) -> int:
    """The socket a DHCP request (the UDP payload) is steered to: its ``chaddr`` bytes
    2-5, whatever ``hlen`` says; 0 for a datagram too short to hold them (as the kernel's
    program)."""
    if len(datagram) < _CHADDR_WORD + 4:
        return 0
    return _mix(int.from_bytes(datagram[_CHADDR_WORD:_CHADDR_WORD + 4], "big"), count)


def steer_program(count: int, *, by: Steer = "source") -> bytes:
    """The filter: A = the IPv4 source address (or chaddr bytes 2-5), mixed
    (``steer_index``); A %= count. A datagram too short for the load ends the program
    with 0: the group's first socket."""
    def insn(code: int, k: int = 0) -> bytes:
        return _INSN.pack(code, 0, 0, k)

    load = (_SKF_NET_OFF + _IPV4_SOURCE) & 0xFFFFFFFF if by == "source" else _CHADDR_WORD
    return b"".join((
        insn(_LD_W_ABS, load),
        insn(_TAX), insn(_RSH_K, 16), insn(_XOR_X),  # A ^= A >> 16
        insn(_MUL_K, _MIX),
        insn(_TAX), insn(_RSH_K, 16), insn(_XOR_X),  # A ^= A >> 16
        insn(_MOD_K, count),
        insn(_RET_A),
    ))


def steer(sock: socket.socket, count: int, *, by: Steer = "source") -> None:
    """Attach the program to ``sock``'s reuseport group (OSError where the kernel lacks
    it: before Linux 4.5)."""
    program = steer_program(count, by=by)
    buffer = ctypes.create_string_buffer(program)
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}
    fprog = struct.pack("HL", len(program) // _INSN.size, ctypes.addressof(buffer))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot steer the port's requests by {by} "
                                 f"(SO_ATTACH_REUSEPORT_CBPF, Linux 4.5 or later): "
                                 f"{exc.strerror}; workers = 1 needs no steering") from exc


def reuseport_group(host: str, port: int, count: int, *, by: Steer = "source",
                    interface: str | None = None,
                    broadcast: bool = False) -> list[socket.socket]:
    """``count`` bound, non-blocking UDP sockets on ``host:port`` (port 0: one the kernel
    picks), requests steered by source address or by DHCP ``chaddr`` (``by``)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = udp_socket(host, port, reuse=False, reuse_port=True, interface=interface,
                              broadcast=broadcast)
            socks.append(sock)
            port = sock.getsockname()[1]
        steer(socks[0], count, by=by)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks
