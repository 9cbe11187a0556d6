"""Read-only TFTP server on asyncio (RFC 1350; options RFC 2347 blksize 2348, timeout and
tsize 2349, windowsize 7440), jailed to its root.

Not tftpy (the issue's first choice): its server is one blocking ``select()`` loop
(FD_SETSIZE caps it below 1,000 transfers), accepts uploads, follows symlinks out of its
root (``abspath``), has no windowsize, and sees a shutdown only between ``select()``
timeouts. Here: ``tftp.workers`` processes (default one per CPU less the daemon's own, at
most 8; ``tftp_workers.py``) each read requests on their own ``SO_REUSEPORT`` socket of the
listening port, the requests steered by source address (``reuseport.py``); each checks
the limits and the jail, opens the file and runs the transfers (``tftp_service.py``:
each transfer a callback-driven state machine on its own UDP socket, the transfer ID).
With one worker, all of that runs in the daemon's loop instead. Packets:
``tftp_packets.py``; jail and file cache: ``tftp_files.py``; a transfer:
``tftp_transfer.py``.

Refused with an ERROR packet: writes, absolute paths, ``..`` components (``\\`` counts as
``/``), anything that resolves outside the root (symlinks included), and what is not a
regular file (devices, FIFOs, directories).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from provisioner.boot.reuseport import reuseport_group
from provisioner.boot.sockets import udp_socket
from provisioner.boot.tftp_service import TftpService
from provisioner.boot.tftp_transfer import raise_fd_limit
from provisioner.boot.tftp_workers import TftpWorkers
from provisioner.config import TftpSettings, parse_host_port
from provisioner.errors import ConfigError

log = logging.getLogger(__name__)

MAX_PER_SOURCE = 64  # concurrent transfers to one address (a PXE client needs one)
DEFAULT_MAX_WORKERS = 8
_CACHE_BYTES = 256 * 1024 * 1024


def worker_count(settings: TftpSettings) -> int:
    """How many worker processes serve transfers; 0: the daemon's own loop does.
    ``tftp.workers``, where 1 means the daemon's loop; by default one per CPU this process
    may run on less the one the daemon's loop needs (DHCP, HTTP, the API), at least one and
    at most ``DEFAULT_MAX_WORKERS`` (each is a Python process: ~20 MB; first stages are
    small); never more than ``tftp.max_transfers`` (each worker takes a share)."""
    if settings.workers is not None:
        wanted = 0 if settings.workers == 1 else settings.workers
    else:
        wanted = max(1, min(len(os.sched_getaffinity(0)) - 1, DEFAULT_MAX_WORKERS))
    return min(wanted, settings.max_transfers)


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
        self._max_per_source = max_per_source
        self._address: tuple[str, int] | None = None
        self._workers: TftpWorkers | None = None
        self._service: TftpService | None = None  # transfers in this process (one worker)

    @property
    def address(self) -> tuple[str, int]:
        assert self._address is not None, "not started"
        return self._address

    @property
    def workers(self) -> TftpWorkers | None:
        """The worker processes; None when transfers run in the daemon's loop."""
        return self._workers

    async def start(self) -> None:
        if not self._root.is_dir():
            raise ConfigError(f"TFTP root {self._root} is not a directory")
        settings, count = self._settings, self._workers_wanted
        max_fds = settings.max_transfers + 256
        if count == 0:
            raise_fd_limit(max_fds)
            # the boot servers' socket (4 MiB receive buffer): a rack's requests arrive at once
            sock = udp_socket(self._host, self._port, reuse=False)
            self._address = sock.getsockname()[:2]
            self._service = TftpService(
                self._root, host=self._host, timeout_s=settings.timeout_s,
                retries=settings.retries, max_transfers=settings.max_transfers,
                max_per_source=self._max_per_source, cache_bytes=_CACHE_BYTES)
            self._service.start(sock)
        else:
            group = reuseport_group(self._host, self._port, count)
            self._address = group[0].getsockname()[:2]
            self._workers = TftpWorkers(
                group, root=self._root, host=self._host, timeout_s=settings.timeout_s,
                retries=settings.retries, max_transfers=settings.max_transfers,
                max_per_source=self._max_per_source, max_fds=max_fds,
                cache_bytes=_CACHE_BYTES // count)
            try:
                await self._workers.start()
            except BaseException:
                await self.stop()
                raise
        log.info("TFTP serving %s on %s:%s (read-only, %s)", self._root, *self.address,
                 f"{count} worker process{'es' if count > 1 else ''}" if self._workers
                 else "in the daemon's process")

    async def stop(self) -> None:
        if self._workers is not None:
            await self._workers.stop()
            self._workers = None
        if self._service is not None:
            await self._service.stop()
            self._service = None
