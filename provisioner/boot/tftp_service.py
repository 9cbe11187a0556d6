"""TFTP's request side, in whichever process serves transfers: the daemon's
(``tftp.workers = 1``) or each worker process (``tftp_worker.py``), on its own listening
socket. It reads the requests, applies the limits, opens the file through the jail, and
runs the transfer.

The limits are exact per process: every request from one address reaches the same
process (``reuseport.py`` steers them by source address), so ``max_per_source`` counts
all of that address's transfers; ``max_transfers`` is this process's share of
``tftp.max_transfers``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provisioner.boot.sockets import DatagramSocket
from provisioner.boot.tftp_files import FileCache, open_jailed
from provisioner.boot.tftp_packets import (
    E_ACCESS,
    E_UNDEFINED,
    ReadRequest,
    TftpError,
    answerable,
    error_packet,
    opcode_of,
    parse_request,
)
from provisioner.boot.tftp_transfer import Peer, SocketHub, Transfer, as_netascii, udp_socket

log = logging.getLogger("provisioner.boot.tftp")
DROP_LOG_INTERVAL_S = 60.0


class DropLog:
    """Datagrams the listening port drops unanswered (``tftp_packets.answerable``): all
    counted, one log line per ``interval_s`` at most (a flood of them must not flood the
    journal either), which says how many went since the last."""

    def __init__(self, *, interval_s: float = DROP_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s, self._clock = interval_s, clock
        self.total = 0
        self._unlogged = 0
        self._logged_at: float | None = None

    def note(self, data: bytes, peer: Peer) -> None:
        self.total += 1
        self._unlogged += 1
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self._interval_s:
            return
        log.warning("TFTP: dropped %d datagram(s) on the listening port that were not "
                    "requests (the last: opcode %s from %s:%d); a listening port never "
                    "answers DATA, ACK, ERROR or OACK (%d dropped in all)", self._unlogged,
                    opcode_of(data), peer[0], peer[1], self.total)
        self._logged_at, self._unlogged = now, 0


class TftpService:
    def __init__(self, root: Path, *, host: str, timeout_s: float, retries: int,
                 max_transfers: int, max_per_source: int, cache_bytes: int) -> None:
        """``root``: resolved; ``host``: the address transfer sockets bind to."""
        self._root, self._host = root, host
        self._timeout_s, self._retries = timeout_s, retries
        self._max_transfers, self._max_per_source = max_transfers, max_per_source
        self._cache = FileCache(cache_bytes)
        self._live: dict[Peer, Transfer | None] = {}  # None: its file is being read
        self._per_source: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._hub: SocketHub | None = None
        self._listener: DatagramSocket | None = None
        self.drops = DropLog()

    def start(self, sock: socket.socket) -> None:
        """Serve the requests that reach ``sock`` (bound, non-blocking), in the running
        loop, until ``stop``."""
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tftp-read")
        self._hub = SocketHub()
        self._listener = DatagramSocket(sock, self._request)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for transfer in list(self._live.values()):
            if transfer is not None:
                transfer.finish("server stopping")
        self._live.clear()
        self._per_source.clear()
        if self._hub is not None:
            self._hub.close()
            self._hub = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _request(self, data: bytes, peer: Peer, listener: DatagramSocket) -> None:
        """A datagram on the listening socket. Never raises. Only a request (or an unknown
        opcode) is answered: see ``tftp_packets.NEVER_ANSWERED``."""
        if peer in self._live:
            transfer = self._live[peer]
            if transfer is None:
                return  # a retransmitted request while its file is read
            transfer.poll()  # the client's ERROR or last ACK may wait in its socket
            if peer in self._live:
                return  # a retransmitted request of a transfer under way
        if not answerable(data):
            self.drops.note(data, peer)
            return
        if len(self._live) >= self._max_transfers:
            listener.sendto(error_packet(E_UNDEFINED, "server busy, retry later"), peer)
            return
        if self._per_source[peer[0]] >= self._max_per_source:
            log.debug("TFTP: refused a request from %s: too many transfers", peer[0])
            listener.sendto(error_packet(E_UNDEFINED, "too many transfers from this address"),
                            peer)
            return
        try:
            req = parse_request(data)
        except TftpError as exc:
            log.debug("TFTP: refused a request from %s: %s", peer[0], exc.message)
            listener.sendto(error_packet(exc.code, exc.message), peer)
            return
        self._live[peer] = None
        self._per_source[peer[0]] += 1
        task = asyncio.get_running_loop().create_task(self._serve(req, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, req: ReadRequest, peer: Peer) -> None:
        try:
            assert self._pool is not None and self._hub is not None
            data = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._read, req.filename)
            transfer = Transfer(peer, req, as_netascii(data, req.mode), hub=self._hub,
                                timeout_s=self._timeout_s, retries=self._retries,
                                on_done=self._done)
            self._live[peer] = transfer
            transfer.start(udp_socket(self._host, 0))
        except TftpError as exc:
            log.info("TFTP: refused %r to %s: %s", req.filename, peer[0], exc.message)
            self._fail(peer, exc.code, exc.message)
        except OSError as exc:
            log.warning("TFTP: cannot serve %r to %s: %s", req.filename, peer[0], exc)
            self._fail(peer, E_ACCESS, "cannot read the file")
        except Exception:  # the task's boundary: never leave the peer's slot taken
            log.exception("TFTP: request %r from %s crashed", req.filename, peer[0])
            self._fail(peer, E_UNDEFINED, "internal error")

    def _read(self, name: str) -> bytes:
        """The jail opens the file; the cache reads it (and closes the descriptor)."""
        return self._cache.load_fd(open_jailed(self._root, name))

    def _fail(self, peer: Peer, code: int, message: str) -> None:
        if self._listener is not None:
            self._listener.sendto(error_packet(code, message), peer)
        self._done(peer)

    def _done(self, peer: Peer) -> None:
        if peer not in self._live:
            return
        del self._live[peer]
        self._per_source[peer[0]] -= 1
        if self._per_source[peer[0]] <= 0:
            del self._per_source[peer[0]]
