"""One TFTP read transfer on its own UDP socket (the transfer ID), in whichever process
serves it: the daemon's (one worker) or a worker process (``tftp_worker.py``)."""

from __future__ import annotations

import asyncio
import logging
import resource
import select
import socket
from collections.abc import Callable

from provisioner.boot.tftp_packets import (
    ACK,
    DATA,
    ERROR,
    HEAD,
    ReadRequest,
    negotiate,
    oack_packet,
)

log = logging.getLogger(__name__)

Peer = tuple[str, int]


class SocketHub:
    """Every transfer socket of a process behind one reader of the event loop (an epoll of
    its own): one wake-up serves every transfer with an ACK waiting, without a loop
    callback per socket (the per-ACK cost is what limits a TFTP server in Python)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._loop.add_reader(self._epoll.fileno(), self._ready)

    def add(self, fd: int, callback: Callable[[], object]) -> None:
        self._epoll.register(fd, select.EPOLLIN)
        self._callbacks[fd] = callback

    def remove(self, fd: int) -> None:
        if self._callbacks.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._callbacks.clear()

    def _ready(self) -> None:
        for fd, _ in self._epoll.poll(0, 1024):
            if (callback := self._callbacks.get(fd)) is not None:
                callback()


class Transfer:
    """OACK (if options), then windows of DATA until the last ACK. Its socket is connected
    to the client (as tftpd-hpa's is: a datagram from any other address never reaches it,
    RFC 1350's "unknown transfer ID" error is not sent, a client that went away shows as
    an ICMP error on the next read, and a send skips the route look-up and the address
    parsing), read through the ``SocketHub`` (one datagram per report) and written
    directly; one retransmit timer, re-armed from the last progress rather than per ACK.
    ``on_done(peer)`` once at the end, however it ends."""

    def __init__(self, peer: Peer, req: ReadRequest, data: bytes, *, hub: SocketHub,
                 timeout_s: float, retries: int, on_done: Callable[[Peer], None]) -> None:
        self._peer, self._name, self._on_done, self._hub = peer, req.filename, on_done, hub
        self._data = memoryview(data)
        self._timeout_s, self._max_retries = timeout_s, retries
        self._oack = negotiate(req.options, len(data))
        self._blksize = int(self._oack.get("blksize", 512))
        self._window = int(self._oack.get("windowsize", 1))
        if "timeout" in self._oack:
            self._timeout_s = float(self._oack["timeout"])
        self._total = len(data) // self._blksize + 1  # the last block is short (maybe 0)
        self._oack_pending = bool(self._oack)
        self._acked = 0
        self._sent = 0
        self._retries = 0
        self._loop = asyncio.get_running_loop()
        self._started = self._progress = self._loop.time()
        self._sock: socket.socket | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._done = False

    def start(self, sock: socket.socket) -> None:
        """Serve through ``sock`` (bound, not yet connected); OSError if it cannot reach
        the client."""
        self._sock = sock
        sock.connect(self._peer)
        self._hub.add(sock.fileno(), self._read_one)
        self._send_next()
        self._timer = self._loop.call_at(self._progress + self._timeout_s, self._check)

    def _send(self, packet: bytes | bytearray) -> None:
        assert self._sock is not None
        try:
            self._sock.send(packet)
        except (BlockingIOError, InterruptedError):
            pass  # the socket buffer is full: the retransmit timer sends it again
        except OSError as exc:
            log.debug("TFTP: send to %s failed: %s", self._peer[0], exc)

    def _send_next(self) -> None:
        if self._oack_pending:
            self._send(oack_packet(self._oack))
            return
        last = min(self._acked + self._window, self._total)
        size = self._blksize
        for block in range(self._acked + 1, last + 1):
            packet = bytearray(HEAD.pack(DATA, block & 0xFFFF))
            packet += self._data[(block - 1) * size : block * size]
            self._send(packet)
        self._sent = last

    def poll(self) -> None:
        """Handle what the client already sent (an ERROR, the last ACK) now."""
        for _ in range(64):
            if self._done or self._sock is None or not self._read_one():
                return

    def _read_one(self) -> bool:
        """One datagram (the hub calls again while more wait: level-triggered, and no
        EAGAIN raised per ACK); False when none was read."""
        assert self._sock is not None
        try:
            data = self._sock.recv(1024)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:  # e.g. ICMP port unreachable: the client is gone
            self.finish(f"socket error: {exc}")
            return False
        self._datagram(data)
        return True

    def _datagram(self, data: bytes) -> None:
        if len(data) < 4:
            return
        opcode, number = HEAD.unpack_from(data)
        if opcode == ERROR:
            message = data[4:].split(b"\0", 1)[0].decode("latin-1")
            self.finish(f"client error {number}: {message}")
        elif opcode == ACK:
            self._ack(number)

    def _ack(self, number: int) -> None:
        # The absolute block this ACK names, among those sent but not yet acknowledged.
        ahead = (number - self._acked) & 0xFFFF
        if self._oack_pending:
            if number != 0:
                return
            self._oack_pending = False
        elif not 0 < ahead <= self._sent - self._acked:
            return  # a duplicate or stale ACK: never answered (Sorcerer's Apprentice)
        else:
            self._acked += ahead
        self._retries = 0
        self._progress = self._loop.time()
        if self._acked == self._total:
            self.finish(None)
        else:
            self._send_next()

    def _check(self) -> None:
        deadline = self._progress + self._timeout_s
        if self._loop.time() < deadline:  # progress since: wait for the new deadline
            self._timer = self._loop.call_at(deadline, self._check)
            return
        self._retries += 1
        if self._retries > self._max_retries:
            self.finish(f"no ACK after {self._max_retries} retransmits")
            return
        self._progress = self._loop.time()
        self._send_next()
        self._timer = self._loop.call_at(self._progress + self._timeout_s, self._check)

    def finish(self, problem: str | None) -> None:
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        if self._sock is not None:
            self._hub.remove(self._sock.fileno())
            self._sock.close()
        self._on_done(self._peer)
        elapsed = self._loop.time() - self._started
        if problem is None:
            log.info("TFTP: sent %s (%d bytes) to %s in %.2f s", self._name, len(self._data),
                     self._peer[0], elapsed)
        else:
            log.info("TFTP: transfer of %s to %s ended: %s", self._name, self._peer[0], problem)


def as_netascii(data: bytes, mode: str) -> bytes:
    return data.replace(b"\r", b"\r\0").replace(b"\n", b"\r\n") if mode == "netascii" \
        else data


def udp_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def raise_fd_limit(wanted: int) -> None:
    """One socket per transfer: lift the soft open-files limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log.info("TFTP: raised the open-files limit from %d to %d", soft, new)
