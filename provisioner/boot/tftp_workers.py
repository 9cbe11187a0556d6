"""The daemon's side of the TFTP worker processes (``tftp_worker.py``), a ``WorkerGroup``
(``worker_group.py``): one ``SO_REUSEPORT`` listening socket per worker, requests steered
by source address (``reuseport.py``).

Why processes: lock-step TFTP costs one datagram in and one out per block, and one event
loop on one core cannot keep up with tftpd-hpa, which forks per client. Why each with its
own listening socket: a storm's requests then never wait behind the daemon's loop (DHCP,
HTTP); each worker applies the jail and the limits itself (``tftp_service.py``), exactly,
since all of one address's requests reach it.
"""

from __future__ import annotations

import socket
from pathlib import Path

from provisioner.boot.worker_group import WorkerGroup, shares


class TftpWorkers(WorkerGroup):
    module = "provisioner.boot.tftp_worker"
    kind = "TFTP"

    def __init__(self, listening: list[socket.socket], *, root: Path, host: str,
                 timeout_s: float, retries: int, max_transfers: int, max_per_source: int,
                 max_fds: int, cache_bytes: int) -> None:
        """``max_transfers`` in all, shared out among the workers."""
        super().__init__(listening)
        self._common = ["--root", str(root), "--host", host, "--timeout-s", str(timeout_s),
                        "--retries", str(retries), "--max-per-source", str(max_per_source),
                        "--max-fds", str(max_fds), "--cache-bytes", str(cache_bytes)]
        self._shares = shares(max_transfers, len(listening))

    def arguments(self, slot: int) -> list[str]:
        return ["--max-transfers", str(self._shares[slot]), *self._common]
