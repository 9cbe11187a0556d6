"""Concurrency limits for BMC calls: at most N in flight per BMC and M in total.

A call waits for its BMC's slot first and only then for a global one, so calls queued on
a slow or dead BMC never hold global slots that other BMCs could use.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class BmcLimiter:
    def __init__(self, *, total: int, per_bmc: int) -> None:
        self._total = asyncio.Semaphore(total)
        self._per_bmc = per_bmc
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self.max_in_flight = 0
        """The most calls ever in flight on one BMC (tests and the bench read it)."""

    def in_flight(self, key: str) -> int:
        return self._in_flight.get(key, 0)

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        sem = self._slots.get(key)
        if sem is None:
            sem = self._slots[key] = asyncio.Semaphore(self._per_bmc)
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with sem, self._total:
                now = self._in_flight[key] = self._in_flight.get(key, 0) + 1
                self.max_in_flight = max(self.max_in_flight, now)
                try:
                    yield
                finally:
                    self._in_flight[key] -= 1
        finally:
            self._users[key] -= 1
            if self._users[key] == 0:  # forget idle BMCs: the maps stay as small as the work
                del self._users[key], self._slots[key]
                self._in_flight.pop(key, None)
