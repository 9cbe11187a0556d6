"""Read-only TFTP server on asyncio (RFC 1350; options RFC 2347 blksize 2348, timeout and
tsize 2349, windowsize 7440), jailed to its root.

Not tftpy (the issue's first choice): its server is one blocking ``select()`` loop
(FD_SETSIZE caps it below 1,000 transfers), accepts uploads, follows symlinks out of its
root (``abspath``), has no windowsize, and sees a shutdown only between ``select()``
timeouts. Here: one callback-driven state machine and one UDP socket (the transfer ID) per
transfer in the daemon's loop; files read in a small named pool, shared between transfers.

Refused with an ERROR packet: writes, absolute paths, ``..`` components (``\\`` counts as
``/``), anything that resolves outside the root (symlinks included), and what is not a
regular file (devices, FIFOs, directories).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import stat
import struct
import threading
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from provisioner.config import TftpSettings, parse_host_port
from provisioner.errors import ConfigError

log = logging.getLogger(__name__)

RRQ, WRQ, DATA, ACK, ERROR, OACK = 1, 2, 3, 4, 5, 6
E_UNDEFINED, E_NOT_FOUND, E_ACCESS, E_ILLEGAL, E_UNKNOWN_TID, E_OPTIONS = 0, 1, 2, 4, 5, 8
MAX_BLKSIZE = 65464
MAX_WINDOWSIZE = 64
MAX_PER_SOURCE = 64  # concurrent transfers to one address (a PXE client needs one)
_CACHE_BYTES = 256 * 1024 * 1024
_HEAD = struct.Struct("!HH")


class TftpError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_packet(code: int, message: str) -> bytes:
    return _HEAD.pack(ERROR, code) + message.encode("ascii", "replace") + b"\0"


@dataclass(frozen=True, slots=True)
class ReadRequest:
    filename: str
    mode: str
    options: dict[str, str]


def parse_request(data: bytes) -> ReadRequest:
    """An RRQ; TftpError (code and reason for the ERROR packet) for anything else."""
    if len(data) < 4:
        raise TftpError(E_ILLEGAL, "short packet")
    opcode = int.from_bytes(data[:2], "big")
    if opcode == WRQ:
        raise TftpError(E_ACCESS, "read-only server: writes are refused")
    if opcode != RRQ:
        raise TftpError(E_ILLEGAL, f"opcode {opcode} is not a request")
    fields = data[2:].split(b"\0")
    if len(fields) < 3 or fields[-1] != b"" or not fields[0]:
        raise TftpError(E_ILLEGAL, "malformed request")
    try:
        name, mode, *rest = (f.decode("utf-8") for f in fields[:-1])
    except UnicodeDecodeError:
        raise TftpError(E_ACCESS, "file name is not UTF-8") from None
    options = {rest[i].lower(): rest[i + 1] for i in range(0, len(rest) - 1, 2)}
    return ReadRequest(name, mode.lower(), options)


def jail(root: Path, name: str) -> Path:
    """The regular file ``name`` under ``root`` (already resolved), or TftpError."""
    name = name.replace("\\", "/")
    if name.startswith("/"):
        raise TftpError(E_ACCESS, "absolute paths are refused")
    if ".." in name.split("/"):
        raise TftpError(E_ACCESS, "'..' is refused")
    try:
        target = (root / name).resolve(strict=True)
    except FileNotFoundError:
        raise TftpError(E_NOT_FOUND, "file not found") from None
    except (OSError, RuntimeError):
        raise TftpError(E_ACCESS, "cannot resolve the file name") from None
    if not target.is_relative_to(root):
        raise TftpError(E_ACCESS, "outside the TFTP root")
    return target


class _FileCache:
    """File contents by (device, inode, size, mtime): one copy for concurrent transfers."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._entries: OrderedDict[tuple[int, int, int, int], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def load_blocking(self, path: Path) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # FIFOs never block
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise TftpError(E_ACCESS, "not a regular file")
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            with self._lock:
                if (hit := self._entries.get(key)) is not None:
                    self._entries.move_to_end(key)
                    return hit
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
        finally:
            os.close(fd)
        self._remember(key, data)
        return data

    def _remember(self, key: tuple[int, int, int, int], data: bytes) -> None:
        if len(data) > self._max // 4:
            return
        with self._lock:
            if key not in self._entries:
                self._entries[key] = data
                self._size += len(data)
            while self._size > self._max:
                _, old = self._entries.popitem(last=False)
                self._size -= len(old)


class TftpServer:
    def __init__(self, settings: TftpSettings, root: Path, *,
                 max_per_source: int = MAX_PER_SOURCE) -> None:
        """``max_per_source``: concurrent transfers to one address (a flood from one machine
        cannot take every one of ``max_transfers``)."""
        if settings.listen is None:
            raise ConfigError("tftp.listen is not set")
        self._settings = settings
        self._host, self._port = parse_host_port(settings.listen)
        self._root = root.resolve()
        self._cache = _FileCache(_CACHE_BYTES)
        self._pool: ThreadPoolExecutor | None = None
        self._listener: asyncio.DatagramTransport | None = None
        self._active: dict[tuple[str, int], _Transfer | None] = {}
        self._max_per_source = max_per_source
        self._per_source: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "not started"
        host, port = self._listener.get_extra_info("sockname")[:2]
        return host, port

    async def start(self) -> None:
        if not self._root.is_dir():
            raise ConfigError(f"TFTP root {self._root} is not a directory")
        _raise_fd_limit(self._settings.max_transfers + 256)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tftp")
        sock = _udp(self._host, self._port)
        loop = asyncio.get_running_loop()
        self._listener, _ = await loop.create_datagram_endpoint(
            lambda: _Listener(self), sock=sock)
        log.info("TFTP serving %s on %s:%s (read-only)", self._root, *self.address)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for transfer in list(self._active.values()):
            if transfer is not None:
                transfer.finish("server stopping")
        self._active.clear()
        self._per_source.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def request(self, data: bytes, peer: tuple[str, int]) -> None:
        """A datagram on the listening port. Never raises."""
        if peer in self._active:
            return  # a retransmitted request of a transfer already under way
        if len(self._active) >= self._settings.max_transfers:
            self._reply_error(peer, E_UNDEFINED, "server busy, retry later")
            return
        if self._per_source[peer[0]] >= self._max_per_source:
            log.debug("TFTP: refused a request from %s: too many transfers", peer[0])
            self._reply_error(peer, E_UNDEFINED, "too many transfers from this address")
            return
        try:
            req = parse_request(data)
            if req.mode not in ("octet", "netascii"):
                raise TftpError(E_ILLEGAL, f"mode {req.mode!r} is not supported")
        except TftpError as exc:
            log.debug("TFTP: refused a request from %s: %s", peer[0], exc.message)
            self._reply_error(peer, exc.code, exc.message)
            return
        self._active[peer] = None
        self._per_source[peer[0]] += 1
        task = asyncio.get_running_loop().create_task(self._open(req, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, req: ReadRequest, peer: tuple[str, int]) -> None:
        try:
            assert self._pool is not None
            path = jail(self._root, req.filename)
            data = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._cache.load_blocking, path)
            if req.mode == "netascii":
                data = data.replace(b"\r", b"\r\0").replace(b"\n", b"\r\n")
            transfer = _Transfer(self, peer, req, data, self._settings)
            self._active[peer] = transfer
            transfer.start(_udp(self._host, 0))
        except TftpError as exc:
            log.info("TFTP: refused %r to %s: %s", req.filename, peer[0], exc.message)
            self._reply_error(peer, exc.code, exc.message)
            self.transfer_done(peer)
        except OSError as exc:
            log.warning("TFTP: cannot serve %r to %s: %s", req.filename, peer[0], exc)
            self._reply_error(peer, E_ACCESS, "cannot read the file")
            self.transfer_done(peer)
        except Exception:  # the task's boundary: never leave the peer's slot taken
            log.exception("TFTP: request %r from %s crashed", req.filename, peer[0])
            self._reply_error(peer, E_UNDEFINED, "internal error")
            self.transfer_done(peer)

    def _reply_error(self, peer: tuple[str, int], code: int, message: str) -> None:
        if self._listener is not None:
            self._listener.sendto(error_packet(code, message), peer)

    def transfer_done(self, peer: tuple[str, int]) -> None:
        if peer not in self._active:
            return
        del self._active[peer]
        self._per_source[peer[0]] -= 1
        if self._per_source[peer[0]] <= 0:
            del self._per_source[peer[0]]


class _Listener(asyncio.DatagramProtocol):
    def __init__(self, server: TftpServer) -> None:
        self._server = server

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._server.request(data, addr)


class _Transfer:
    """One read transfer: OACK (if options), then windows of DATA until the last ACK. Its
    socket is read with ``add_reader`` (drained per wake-up) and written directly; one
    retransmit timer, re-armed from the last progress rather than per ACK."""

    def __init__(self, server: TftpServer, peer: tuple[str, int], req: ReadRequest,
                 data: bytes, settings: TftpSettings) -> None:
        self._server, self._peer, self._name = server, peer, req.filename
        self._data = memoryview(data)
        self._timeout_s, self._max_retries = settings.timeout_s, settings.retries
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
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._readable)
        self._send_next()
        self._timer = self._loop.call_at(self._progress + self._timeout_s, self._check)

    def _send(self, packet: bytes | bytearray) -> None:
        assert self._sock is not None
        try:
            self._sock.sendto(packet, self._peer)
        except (BlockingIOError, InterruptedError):
            pass  # the socket buffer is full: the retransmit timer sends it again
        except OSError as exc:
            log.debug("TFTP: send to %s failed: %s", self._peer[0], exc)

    def _send_next(self) -> None:
        if self._oack_pending:
            body = b"".join(k.encode() + b"\0" + v.encode() + b"\0"
                            for k, v in self._oack.items())
            self._send(OACK.to_bytes(2, "big") + body)
            return
        last = min(self._acked + self._window, self._total)
        size = self._blksize
        for block in range(self._acked + 1, last + 1):
            packet = bytearray(_HEAD.pack(DATA, block & 0xFFFF))
            packet += self._data[(block - 1) * size : block * size]
            self._send(packet)
        self._sent = last

    def _readable(self) -> None:
        assert self._sock is not None
        for _ in range(64):  # drain what is queued, bounded so others get their turn
            try:
                data, addr = self._sock.recvfrom(1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. ICMP port unreachable: the client is gone
                self.finish(f"socket error: {exc}")
                return
            self._datagram(data, addr)
            if self._done:
                return

    def _datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr != self._peer:
            assert self._sock is not None
            with contextlib.suppress(OSError):
                self._sock.sendto(error_packet(E_UNKNOWN_TID, "unknown transfer ID"), addr)
            return
        if len(data) < 4:
            return
        opcode, number = _HEAD.unpack_from(data)
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
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        self._server.transfer_done(self._peer)
        elapsed = self._loop.time() - self._started
        if problem is None:
            log.info("TFTP: sent %s (%d bytes) to %s in %.2f s", self._name, len(self._data),
                     self._peer[0], elapsed)
        else:
            log.info("TFTP: transfer of %s to %s ended: %s", self._name, self._peer[0], problem)


def negotiate(options: dict[str, str], size: int) -> dict[str, str]:
    """The options we accept (RFC 2347): what goes into the OACK, in request order."""
    accepted: dict[str, str] = {}
    for name, value in options.items():
        # ASCII digits only: str.isdigit() also takes "²" (int() refuses it), and a few
        # thousand digits overflow int()'s limit; no option needs more than 10
        if not (value.isascii() and value.isdigit() and len(value) <= 10):
            continue
        number = int(value)
        if name == "blksize" and number >= 8:
            accepted[name] = str(min(number, MAX_BLKSIZE))
        elif name == "tsize":
            accepted[name] = str(size)
        elif name == "timeout" and 1 <= number <= 255:
            accepted[name] = str(number)
        elif name == "windowsize" and number >= 1:
            accepted[name] = str(min(number, MAX_WINDOWSIZE))
    return accepted


def _udp(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _raise_fd_limit(wanted: int) -> None:
    """One socket per transfer: lift the soft open-files limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log.info("TFTP: raised the open-files limit from %d to %d", soft, new)
