"""The per-rack power-on stagger: at most N power-ons per rack per second, so a rack's
PDUs never see every node's inrush current at once. Work past the rate waits its turn
(first come, first served); it is never refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from provisioner.domain import Node

_NO_RACK = "(no rack)"


class PowerOnStagger:
    """A token bucket per rack, with a burst of one: power-ons ``1 / rate`` seconds apart.

    Nodes without a rack share one bucket (the safe guess: they may share a PDU)."""

    def __init__(self, per_rack_per_s: float | None, *, exempt: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._interval_s = 1.0 / per_rack_per_s if per_rack_per_s else 0.0
        self._clock = clock
        self._sleep = sleep
        self._exempt = frozenset(exempt)
        self._next_at: dict[str, float] = {}

    @classmethod
    def unlimited(cls) -> PowerOnStagger:
        return cls(None)

    async def wait(self, node: Node) -> None:
        """Return when the node's rack may power one more node on (reserves that slot).

        Nodes whose BMC driver is exempt (the simulated ``fake``) never wait."""
        if self._interval_s == 0 or (node.bmc is not None and node.bmc.driver in self._exempt):
            return
        key = node.rack or _NO_RACK
        now = self._clock()
        at = max(now, self._next_at.get(key, now))
        self._next_at[key] = at + self._interval_s
        if at > now:
            await self._sleep(at - now)
