"""Minimal sd_notify(3) client: READY=1, STOPPING=1, WATCHDOG=1 and STATUS= over $NOTIFY_SOCKET.

Standard library only. Sends never block and never raise: the daemon must not stall or die
because systemd is slow or gone. The first failed send is logged at WARNING, later ones not.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends notifications to the service manager; a no-op when there is no socket."""

    def __init__(self, socket_path: str | None = None) -> None:
        path = os.environ.get("NOTIFY_SOCKET", "") if socket_path is None else socket_path
        # "@name" is a Linux abstract socket: its address starts with a NUL byte.
        self._address = "\0" + path[1:] if path.startswith("@") else path
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_one_line(text)}")

    def notify(self, message: str) -> bool:
        """Send one datagram; True if it was handed to the kernel."""
        if not self._address:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(message.encode(), self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "sd_notify to %r failed (further failures not logged): %s", self._address, exc
                )
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """Half of $WATCHDOG_USEC in seconds (how often to send WATCHDOG=1), or None if not asked.

    $WATCHDOG_PID, when set, must be our PID: otherwise the variables were meant for a parent.
    """
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    try:
        if not usec or (pid and int(pid) != os.getpid()):
            return None
        interval_us = int(usec)
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r / WATCHDOG_PID=%r", usec, pid)
        return None
    return interval_us / 2_000_000 if interval_us > 0 else None


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())
