"""What the boot servers need to know about nodes, as a Protocol the lifecycle implements
(``lifecycle.discovery``); ``KnownNode`` is a domain value, re-exported here."""

from __future__ import annotations

from typing import Protocol

from provisioner.domain import KnownNode as KnownNode


class BootInventory(Protocol):
    async def lookup(self, mac: str) -> KnownNode | None:
        """The node that owns ``mac``, or None for a MAC never seen."""
        ...

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        """An unknown MAC booted (``client`` = its ClientClass value); may enroll it as
        ``discovered`` (rate-limited)."""
        ...
