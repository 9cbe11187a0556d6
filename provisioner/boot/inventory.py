"""What the boot servers need to know about nodes, as a Protocol the lifecycle implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class KnownNode:
    node_id: str
    hostname: str | None
    state: str


class BootInventory(Protocol):
    async def lookup(self, mac: str) -> KnownNode | None:
        """The node that owns ``mac``, or None for a MAC never seen."""
        ...

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        """An unknown MAC booted (``client`` = its ClientClass value); may enroll it as
        ``discovered`` (rate-limited)."""
        ...
