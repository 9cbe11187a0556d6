"""One UDP port served by several processes: a group of ``SO_REUSEPORT`` sockets bound to
it, and a classic BPF program that steers each datagram to a socket by its source
address, so that every request from one address reaches the same process (its limits
count all of that address's transfers, and a retransmitted request finds its transfer).

The kernel numbers a group's sockets in the order they were bound; the program returns a
hash of the source address modulo the socket count (``steer_index`` computes the same in
Python). The hash mixes every bit of the address: a plain ``address % count`` would send
every client whose addresses end alike (``10.0.k.2``) to one socket. An index past the
group's end (a socket closed) falls back to the kernel's own hash, so a shrunken group
still delivers everything.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct

from provisioner.boot.sockets import udp_socket

SO_ATTACH_REUSEPORT_CBPF = 51  # Linux, include/uapi/asm-generic/socket.h
_SKF_NET_OFF = -0x100000  # loads relative to the network header
_IPV4_SOURCE = 12  # offset of the source address in the IPv4 header
_MIX = 0x45D9F3B  # an odd multiplier that spreads each input bit over the word

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;}
_LD_W_ABS, _TAX, _RSH_K, _XOR_X, _MUL_K, _MOD_K, _RET_A = (
    0x20, 0x07, 0x74, 0xAC, 0x24, 0x94, 0x16)
_INSN = struct.Struct("=HBBI")


def steer_index(address: str, count: int) -> int:
    """The socket an IPv4 source address is steered to: what the program computes."""
    a = int(ipaddress.IPv4Address(address))
    a ^= a >> 16
    a = (a * _MIX) & 0xFFFFFFFF
    a ^= a >> 16
    return a % count


def steer_program(count: int) -> bytes:
    """The filter: A = the IPv4 source address, mixed (``steer_index``); A %= count."""
    def insn(code: int, k: int = 0) -> bytes:
        return _INSN.pack(code, 0, 0, k)

    return b"".join((
        insn(_LD_W_ABS, (_SKF_NET_OFF + _IPV4_SOURCE) & 0xFFFFFFFF),
        insn(_TAX), insn(_RSH_K, 16), insn(_XOR_X),  # A ^= A >> 16
        insn(_MUL_K, _MIX),
        insn(_TAX), insn(_RSH_K, 16), insn(_XOR_X),  # A ^= A >> 16
        insn(_MOD_K, count),
        insn(_RET_A),
    ))


def steer_by_source(sock: socket.socket, count: int) -> None:
    """Attach the program to ``sock``'s reuseport group (OSError where the kernel lacks
    it: before Linux 4.5)."""
    program = steer_program(count)
    buffer = ctypes.create_string_buffer(program)
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}
    fprog = struct.pack("HL", len(program) // _INSN.size, ctypes.addressof(buffer))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot steer the port's requests by source address "
                                 f"(SO_ATTACH_REUSEPORT_CBPF, Linux 4.5 or later): "
                                 f"{exc.strerror}; tftp.workers = 1 needs no steering") from exc


def reuseport_group(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` bound, non-blocking UDP sockets on ``host:port`` (port 0: one the kernel
    picks), requests steered by source address."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = udp_socket(host, port, reuse=False, reuse_port=True)
            socks.append(sock)
            port = sock.getsockname()[1]
        steer_by_source(socks[0], count)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks
