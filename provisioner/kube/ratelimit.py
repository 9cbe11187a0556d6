"""An asyncio token bucket: ``qps`` tokens a second, at most ``burst`` saved up (client-go's
flowcontrol.NewTokenBucketRateLimiter). Waiting happens on the loop, never in a thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self._qps = qps
        self._burst = float(burst)
        self._now = now
        self._sleep = sleep
        self._tokens = float(burst)
        self._stamp = now()
        self._lock = asyncio.Lock()  # FIFO: waiters are served in arrival order

    async def acquire(self) -> float:
        """Take one token, waiting for it if needed; return the seconds waited (queue included)."""
        entered = self._now()
        async with self._lock:
            self._refill()
            wait_s = 0.0
            if self._tokens < 1.0:
                wait_s = (1.0 - self._tokens) / self._qps
                await self._sleep(wait_s)
                self._refill()
            self._tokens = max(self._tokens - 1.0, 0.0)
            return self._now() - entered

    def _refill(self) -> None:
        now = self._now()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._qps)
        self._stamp = now
