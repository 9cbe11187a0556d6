"""Per-source budgets for the boot services: a flood from one MAC (DHCP) cannot take the
work meant for every machine. Each key (a MAC) gets a token bucket (``rate_per_s``, ``burst``)
and at most ``max_in_flight`` requests being answered at once; the ``max_keys`` most recently
seen keys are remembered (memory stays bounded whatever the number of forged MACs)."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable


class PerKeyLimit:
    def __init__(self, *, rate_per_s: float, burst: int, max_in_flight: int,
                 max_keys: int = 65_536, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate, self._burst, self._max_in_flight = rate_per_s, float(burst), max_in_flight
        self._max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when
        self._in_flight: Counter[str] = Counter()

    def admit(self, key: str) -> str | None:
        """None when ``key`` may have one more request answered (call ``done`` after);
        otherwise why not."""
        if self._in_flight[key] >= self._max_in_flight:
            return "too many requests in flight from one MAC"
        now = self._clock()
        tokens, then = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - then) * self._rate)
        if tokens < 1.0:
            self._remember(key, tokens, now)
            return "request rate from one MAC over its budget"
        self._remember(key, tokens - 1.0, now)
        self._in_flight[key] += 1
        return None

    def done(self, key: str) -> None:
        self._in_flight[key] -= 1
        if self._in_flight[key] <= 0:
            del self._in_flight[key]

    def _remember(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
