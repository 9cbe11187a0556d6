"""A TFTP worker process: serves the transfers the daemon hands it (``tftp_workers.py``).

Run as ``python -m provisioner.boot.tftp_worker --control FD ...``. The control socket
(SOCK_SEQPACKET, one JSON object a message) brings jobs, each with its file open as an
SCM_RIGHTS descriptor: ``{"peer": [host, port], "name", "mode", "options"}``. Back go
``{"ready": pid}`` once, ``{"done": [host, port]}`` when a transfer ends (however it ends:
the daemon then frees the peer's slot), and ``{"log": [logger, level, text]}``, which the
daemon re-emits through its own logging. A request from a peer whose transfer the daemon
still counts comes as ``{"again": [host, port], "rrq": base64}``: dropped while that
transfer lives (a retransmitted request), else sent back to be served (the client ended
its transfer and asked again before the ``done`` reached the daemon; a retransmit that
raced the transfer's end is served again, which the client refuses as an unknown TID).
A worker never resolves a file name: the daemon's jail opened the file, the worker reads
the descriptor (``FileCache``) and sends.

It dies with the daemon: ``PR_SET_PDEATHSIG`` (SIGKILL when the daemon's spawning thread
ends, SIGKILL of the daemon included) and, as a second guard, the end of the control
socket.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from provisioner.boot.tftp_files import FileCache
from provisioner.boot.tftp_packets import (
    E_ACCESS,
    E_UNDEFINED,
    ReadRequest,
    TftpError,
    error_packet,
)
from provisioner.boot.tftp_transfer import (
    Peer,
    SocketHub,
    Transfer,
    as_netascii,
    raise_fd_limit,
    udp_socket,
)

log = logging.getLogger(__name__)

MAX_MESSAGE = 1 << 18  # at most one UDP datagram's worth of request, base64
_LOG_CHARS = 8192  # a log line's text, well inside MAX_MESSAGE once JSON-escaped
_PR_SET_PDEATHSIG = 1
_FD = array.array("i")


class Channel:
    """The worker's end of the control socket: blocking sends from any thread (a ``done``
    must never be dropped), non-blocking reads from the event loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        try:
            with self._lock:
                self.sock.sendall(data)
        except OSError:
            os._exit(0)  # the daemon is gone: so are we


class ChannelLog(logging.Handler):
    """Log records to the daemon, which logs them as its own."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self._channel.send({"log": [record.name, record.levelno, text[:_LOG_CHARS]]})


class Worker:
    def __init__(self, channel: Channel, args: argparse.Namespace) -> None:
        self._channel, self._host = channel, args.host
        self._timeout_s, self._retries = args.timeout_s, args.retries
        self._cache = FileCache(args.cache_bytes)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tftp-read")
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: dict[Peer, Transfer | None] = {}  # None: its file is being read

    async def serve(self) -> None:
        """Until the daemon closes the control socket."""
        loop = asyncio.get_running_loop()
        self._hub = SocketHub()
        self._gone: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self._channel.sock.fileno(), self._readable)
        self._channel.send({"ready": os.getpid()})
        await self._gone

    def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(64):
            try:
                data, fds = receive(self._channel.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data:
                loop.remove_reader(self._channel.sock.fileno())
                if not self._gone.done():
                    self._gone.set_result(None)
                return
            job = json.loads(data)
            if "again" in job:
                self._again(job)
                continue
            task = loop.create_task(self._transfer(job, fds))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _transfer(self, job: dict[str, Any], fds: list[int]) -> None:
        peer: Peer = (str(job["peer"][0]), int(job["peer"][1]))
        req = ReadRequest(str(job["name"]), str(job["mode"]), dict(job["options"]))
        self._live[peer] = None
        try:
            if len(fds) != 1:
                raise TftpError(E_UNDEFINED, "internal error: no file")
            data = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._cache.load_fd, fds.pop())
            transfer = Transfer(peer, req, as_netascii(data, req.mode), hub=self._hub,
                                timeout_s=self._timeout_s, retries=self._retries,
                                on_done=self._done)
            transfer.start(udp_socket(self._host, 0))
            if peer in self._live:  # not already over
                self._live[peer] = transfer
        except Exception as exc:  # the task's boundary: never leave the peer's slot taken
            code, text = (exc.code, exc.message) if isinstance(exc, TftpError) else \
                (E_ACCESS, "cannot read the file")
            log.warning("TFTP: cannot serve %r to %s: %s", req.filename, peer[0], exc)
            with contextlib.suppress(OSError), udp_socket(self._host, 0) as sock:
                sock.sendto(error_packet(code, text), peer)
            for fd in fds:
                os.close(fd)
            self._done(peer)

    def _done(self, peer: Peer) -> None:
        self._live.pop(peer, None)
        self._channel.send({"done": list(peer)})

    def _again(self, job: dict[str, Any]) -> None:
        """A request from a peer the daemon still counts as ours."""
        peer: Peer = (str(job["again"][0]), int(job["again"][1]))
        if peer in self._live and (transfer := self._live[peer]) is not None:
            transfer.poll()  # the client's ERROR or last ACK may wait in its socket
        if peer not in self._live:
            self._channel.send(job)


def receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptor it carries, without blocking (``socket.recv_fds``
    ignores its flags before Python 3.12)."""
    data, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(_FD.itemsize),
                                         socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def die_with_parent(parent: int) -> None:
    """SIGKILL when the daemon ends; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--retries", type=int, required=True)
    parser.add_argument("--cache-bytes", type=int, required=True)
    parser.add_argument("--max-fds", type=int, required=True)
    parser.add_argument("--log-level", type=int, default=logging.INFO)
    args = parser.parse_args()
    die_with_parent(args.parent)
    channel = Channel(socket.socket(fileno=args.control))
    channel.sock.setblocking(True)
    root = logging.getLogger()
    root.handlers[:] = [ChannelLog(channel)]
    root.setLevel(args.log_level)
    raise_fd_limit(args.max_fds)
    asyncio.run(Worker(channel, args).serve())
    os._exit(0)  # the daemon closed the control socket: transfers end with the process


if __name__ == "__main__":
    main()
