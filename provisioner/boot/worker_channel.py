"""A boot worker process's end of its control socket (``worker_group.py`` holds the
daemon's): SOCK_SEQPACKET, one JSON object a message; log records go to the daemon, which
logs them as its own; the worker dies with the daemon."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

MAX_MESSAGE = 1 << 16  # a control message (a log record, a batch of MACs), at most
_LOG_CHARS = 8192  # a log line's text, well inside MAX_MESSAGE once JSON-escaped
_PR_SET_PDEATHSIG = 1


class Channel:
    """The worker's end of the control socket: blocking sends from any thread (a log
    record is never dropped)."""

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

    def receive(self) -> dict[str, Any] | None:
        """The next message, blocking (before the worker's loop runs); None at the end."""
        data = self.sock.recv(MAX_MESSAGE)
        return json.loads(data) if data else None


def watch(channel: Channel,
          on_message: Callable[[dict[str, Any]], None]) -> asyncio.Future[None]:
    """Read the daemon's messages in the running loop, each to ``on_message`` (a malformed
    one is logged and dropped); the future is done when the daemon closes the channel,
    its order to stop."""
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        for _ in range(256):
            try:
                data = channel.sock.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(channel.sock.fileno())
                if not gone.done():
                    gone.set_result(None)
                return
            try:
                on_message(json.loads(data))
            except (ValueError, TypeError, KeyError) as exc:
                logging.getLogger(__name__).warning(
                    "worker: a malformed message from the daemon: %s", exc)

    loop.add_reader(channel.sock.fileno(), readable)
    return gone


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


def log_to(channel: Channel, level: int) -> None:
    """Every log record of this process to the daemon, from ``level`` up."""
    root = logging.getLogger()
    root.handlers[:] = [ChannelLog(channel)]
    root.setLevel(level)


def die_with_parent(parent: int) -> None:
    """SIGKILL when the daemon ends; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(0)


def worker_parser(description: str) -> argparse.ArgumentParser:
    """The arguments ``WorkerGroup`` gives every worker (a worker adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    for name in ("--control", "--listen", "--parent"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--log-level", type=int, default=logging.INFO)
    return parser


def attach(args: argparse.Namespace) -> tuple[Channel, socket.socket]:
    """Die with the daemon; its control channel (blocking sends) and the listening socket
    it bound (non-blocking)."""
    die_with_parent(args.parent)
    channel = Channel(socket.socket(fileno=args.control))
    channel.sock.setblocking(True)
    listening = socket.socket(fileno=args.listen)
    listening.setblocking(False)
    return channel, listening
