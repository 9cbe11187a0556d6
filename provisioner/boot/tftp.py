"""Read-only TFTP server on asyncio (RFC 1350; options RFC 2347 blksize 2348, timeout and
tsize 2349, windowsize 7440), jailed to its root.

Not tftpy (the issue's first choice): its server is one blocking ``select()`` loop
(FD_SETSIZE caps it below 1,000 transfers), accepts uploads, follows symlinks out of its
root (``abspath``), has no windowsize, and sees a shutdown only between ``select()``
timeouts. Here: requests arrive on one listening socket in the daemon's loop, which checks
the limits (total, per source address) and the jail, opens the file, and hands the
transfer (one callback-driven state machine with its own UDP socket, the transfer ID) to
a worker process (``tftp_workers.py``; ``tftp.workers``, default one per CPU, at most 8)
or, with one worker, runs it in its own loop. Packets: ``tftp_packets.py``; jail and file
cache: ``tftp_files.py``; a transfer: ``tftp_transfer.py``.

Refused with an ERROR packet: writes, absolute paths, ``..`` components (``\\`` counts as
``/``), anything that resolves outside the root (symlinks included), and what is not a
regular file (devices, FIFOs, directories).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provisioner.boot.sockets import udp_socket as listening_socket
from provisioner.boot.tftp_files import FileCache, open_jailed
from provisioner.boot.tftp_packets import (
    E_ACCESS,
    E_UNDEFINED,
    ReadRequest,
    TftpError,
    error_packet,
    parse_request,
)
from provisioner.boot.tftp_transfer import (
    Peer,
    SocketHub,
    Transfer,
    as_netascii,
    raise_fd_limit,
    udp_socket,
)
from provisioner.boot.tftp_workers import TftpWorkers
from provisioner.config import TftpSettings, parse_host_port
from provisioner.errors import ConfigError

log = logging.getLogger(__name__)

MAX_PER_SOURCE = 64  # concurrent transfers to one address (a PXE client needs one)
DEFAULT_MAX_WORKERS = 8
_CACHE_BYTES = 256 * 1024 * 1024


def worker_count(settings: TftpSettings) -> int:
    """``tftp.workers``, else one per CPU this process may run on, at most
    ``DEFAULT_MAX_WORKERS`` (each is a Python process: ~20 MB; first stages are small)."""
    return settings.workers or min(len(os.sched_getaffinity(0)), DEFAULT_MAX_WORKERS) or 1


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
        self._workers_wanted = worker_count(settings)
        self._cache = FileCache(_CACHE_BYTES)
        self._pool: ThreadPoolExecutor | None = None
        self._workers: TftpWorkers | None = None
        self._hub: SocketHub | None = None  # transfers in this process (one worker)
        self._listener: asyncio.DatagramTransport | None = None
        self._active: dict[Peer, Transfer | None] = {}
        self._max_per_source = max_per_source
        self._per_source: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "not started"
        host, port = self._listener.get_extra_info("sockname")[:2]
        return host, port

    @property
    def workers(self) -> TftpWorkers | None:
        """The worker processes; None when transfers run in the daemon's loop."""
        return self._workers

    async def start(self) -> None:
        if not self._root.is_dir():
            raise ConfigError(f"TFTP root {self._root} is not a directory")
        max_fds = self._settings.max_transfers + 256
        raise_fd_limit(max_fds)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tftp")
        # the boot servers' socket (4 MiB receive buffer): a rack's requests arrive at once
        sock = listening_socket(self._host, self._port, reuse=False)
        loop = asyncio.get_running_loop()
        self._listener, _ = await loop.create_datagram_endpoint(
            lambda: _Listener(self), sock=sock)
        if self._workers_wanted > 1:
            self._workers = TftpWorkers(
                self._workers_wanted, host=self._host, timeout_s=self._settings.timeout_s,
                retries=self._settings.retries, max_fds=max_fds,
                cache_bytes=_CACHE_BYTES // self._workers_wanted,
                on_done=self.transfer_done, on_again=self.request)
            try:
                await self._workers.start()
            except BaseException:
                await self.stop()
                raise
        log.info("TFTP serving %s on %s:%s (read-only, %s)", self._root, *self.address,
                 f"{self._workers_wanted} worker processes" if self._workers
                 else "in the daemon's process")

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._workers is not None:
            await self._workers.stop()
            self._workers = None
        for transfer in list(self._active.values()):
            if transfer is not None:
                transfer.finish("server stopping")
        self._active.clear()
        self._per_source.clear()
        if self._hub is not None:
            self._hub.close()
            self._hub = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def request(self, data: bytes, peer: Peer) -> None:
        """A datagram on the listening port. Never raises."""
        if peer in self._active:  # a retransmitted request of a transfer under way?
            if self._workers is not None:
                self._workers.again(data, peer)  # its worker knows
            return
        if len(self._active) >= self._settings.max_transfers:
            self._reply_error(peer, E_UNDEFINED, "server busy, retry later")
            return
        if self._per_source[peer[0]] >= self._max_per_source:
            log.debug("TFTP: refused a request from %s: too many transfers", peer[0])
            self._reply_error(peer, E_UNDEFINED, "too many transfers from this address")
            return
        try:
            req = parse_request(data)
        except TftpError as exc:
            log.debug("TFTP: refused a request from %s: %s", peer[0], exc.message)
            self._reply_error(peer, exc.code, exc.message)
            return
        self._active[peer] = None
        self._per_source[peer[0]] += 1
        task = asyncio.get_running_loop().create_task(self._open(req, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, req: ReadRequest, peer: Peer) -> None:
        try:
            assert self._pool is not None
            loop = asyncio.get_running_loop()
            fd = await loop.run_in_executor(self._pool, open_jailed, self._root, req.filename)
            if self._workers is not None:
                self._workers.dispatch(fd, req, peer)
                return
            data = await loop.run_in_executor(self._pool, self._cache.load_fd, fd)
            if self._hub is None:
                self._hub = SocketHub()
            transfer = Transfer(peer, req, as_netascii(data, req.mode), hub=self._hub,
                                timeout_s=self._settings.timeout_s,
                                retries=self._settings.retries, on_done=self.transfer_done)
            self._active[peer] = transfer
            transfer.start(udp_socket(self._host, 0))
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

    def _reply_error(self, peer: Peer, code: int, message: str) -> None:
        if self._listener is not None:
            self._listener.sendto(error_packet(code, message), peer)

    def transfer_done(self, peer: Peer) -> None:
        if peer not in self._active:
            return
        del self._active[peer]
        self._per_source[peer[0]] -= 1
        if self._per_source[peer[0]] <= 0:
            del self._per_source[peer[0]]


class _Listener(asyncio.DatagramProtocol):
    def __init__(self, server: TftpServer) -> None:
        self._server = server

    def datagram_received(self, data: bytes, addr: Peer) -> None:
        self._server.request(data, addr)
