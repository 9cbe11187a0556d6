"""A network namespace with a bridge and taps, made by the test and removed after it
(PEERS.md §1). Addresses exist only inside the namespace; nothing routes out."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def netns_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2 is not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Namespace:
    name: str
    bridge_address: str
    taps: list[str] = field(default_factory=list)

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def add_tap(self) -> str:
        tap = f"tap{len(self.taps)}"
        _ip("-n", self.name, "tuntap", "add", "dev", tap, "mode", "tap")
        _ip("-n", self.name, "link", "set", tap, "master", "br0")
        _ip("-n", self.name, "link", "set", tap, "up")
        self.taps.append(tap)
        return tap


@contextmanager
def bridged_namespace(address: str = "10.77.0.1/24") -> Iterator[Namespace]:
    """``ip netns add`` + ``br0`` with ``address``; deleted (with its taps) afterwards."""
    name = f"pv{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "br0", "type", "bridge", "forward_delay", "0",
            "stp_state", "0")
        _ip("-n", name, "addr", "add", address, "dev", "br0")
        _ip("-n", name, "link", "set", "br0", "up")
        yield Namespace(name=name, bridge_address=address.partition("/")[0])
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


@contextmanager
def plain_namespace() -> Iterator[Namespace]:
    """``ip netns add`` with only ``lo`` up; deleted afterwards."""
    name = f"pv{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name=name, bridge_address="")
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
