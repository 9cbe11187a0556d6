"""One UDP port served by several processes: a group of ``SO_REUSEPORT`` sockets bound to
it, and a classic BPF program that steers each datagram to a socket by its source
address, so that every request from one address reaches the same process (its limits
count all of that address's transfers, and a retransmitted request finds its transfer).

The kernel numbers a group's sockets in the order they were bound; the program returns
``source address % count``. An index past the group's end (a socket closed) falls back
to the kernel's own hash, so a shrunken group still delivers everything.
"""

from __future__ import annotations

import ctypes
import socket
import struct

from provisioner.boot.sockets import udp_socket

SO_ATTACH_REUSEPORT_CBPF = 51  # Linux, include/uapi/asm-generic/socket.h
_SKF_NET_OFF = -0x100000  # loads relative to the network header
_IPV4_SOURCE = 12  # offset of the source address in the IPv4 header

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;}
_LD_W_ABS, _ALU_MOD_K, _RET_A = 0x20, 0x94, 0x16
_INSN = struct.Struct("=HBBI")


def steer_program(count: int) -> bytes:
    """The filter: A = the IPv4 source address; A %= count; return A."""
    return b"".join((
        _INSN.pack(_LD_W_ABS, 0, 0, (_SKF_NET_OFF + _IPV4_SOURCE) & 0xFFFFFFFF),
        _INSN.pack(_ALU_MOD_K, 0, 0, count),
        _INSN.pack(_RET_A, 0, 0, 0),
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
