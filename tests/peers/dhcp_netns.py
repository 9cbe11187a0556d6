"""Namespaces joined by veth pairs for the DHCP tests (PEERS.md §1), and entering one from
this process.

``Namespace`` wraps ``ip netns``; ``entered(ns)`` switches the calling thread into the
namespace so sockets created meanwhile live there (they stay there afterwards), which lets a
server under test run in the test's own event loop. Everything is torn down by the test:
processes by PID first, then ``ip netns del``. No address exists outside the namespaces.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_counter = iter(range(1_000_000))


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (not root, no ``ip``), or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 (ip) not installed"
    probe = f"pvprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Namespace:
    def __init__(self, prefix: str = "pv") -> None:
        self.name = f"{prefix}{os.getpid() % 100000}x{next(_counter)}"
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        self._procs: list[subprocess.Popen[bytes]] = []

    def ip(self, *args: str) -> None:
        _ip("-n", self.name, *args)

    def run(self, cmd: Sequence[str], *, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.name, *cmd], capture_output=True,
                              text=True, timeout=timeout, check=check)

    def popen(self, cmd: Sequence[str], *, log: Path | None = None) -> subprocess.Popen[bytes]:
        out = log.open("wb") if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *cmd], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def close(self) -> None:
        for proc in self._procs:
            self.stop(proc)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def veth(a: Namespace, a_if: str, b: Namespace, b_if: str) -> None:
    """A veth pair between two namespaces, both ends up, no addresses."""
    _ip("link", "add", a_if, "netns", a.name, "type", "veth", "peer", "name", b_if,
        "netns", b.name)
    a.ip("link", "set", a_if, "up")
    b.ip("link", "set", b_if, "up")


@contextmanager
def entered(ns: Namespace) -> Iterator[None]:
    """Run the block with this thread inside ``ns`` (sockets made here stay in ``ns``)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns.name}", os.O_RDONLY)
    try:
        if _libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the test namespace failed")
        try:
            yield
        finally:
            if _libc.setns(own, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back failed")
    finally:
        os.close(own)
        os.close(target)


def wait_for(predicate: object, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll a callable until it returns true (blocking; for threads and sync fixtures)."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
