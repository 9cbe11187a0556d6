"""What the boot servers need to know about nodes, as a Protocol the lifecycle implements
(``lifecycle.discovery``); ``KnownNode`` is a domain value, re-exported here."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from provisioner.domain import KnownNode as KnownNode
from provisioner.tasks import TaskSet

log = logging.getLogger(__name__)


class BootInventory(Protocol):
    async def lookup(self, mac: str) -> KnownNode | None:
        """The node that owns ``mac``, or None for a MAC never seen."""
        ...

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        """An unknown MAC booted (``client`` = its ClientClass value); may enroll it as
        ``discovered`` (rate-limited)."""
        ...


class UnknownReports:
    """Unknown MACs that booted, told to the inventory in the background (a DHCP reply never
    waits for an enrolment): one report a MAC at a time, at most ``limit`` at once (forged
    MACs by the thousand wait for their next DISCOVER)."""

    def __init__(self, inventory: BootInventory, limit: int) -> None:
        self._inventory = inventory
        self._limit = limit
        self._reporting: set[str] = set()
        self._tasks = TaskSet()

    def report(self, mac: str, client: str) -> None:
        if mac in self._reporting or len(self._reporting) >= self._limit:
            return
        self._reporting.add(mac)
        self._tasks.spawn(self._report(mac, client), name=f"dhcp-unknown:{mac}")

    async def stop(self) -> None:
        await self._tasks.cancel_all()

    async def _report(self, mac: str, client: str) -> None:
        try:
            await self._inventory.unknown_mac_booted(mac, client)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("DHCP: recording unknown MAC %s failed: %s", mac, exc)
        finally:
            self._reporting.discard(mac)
