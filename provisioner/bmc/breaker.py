"""A circuit breaker per BMC: after N consecutive failures, fail fast; probe with back-off.

A dead BMC then costs one probe per back-off period instead of a timeout per call, and
never holds a thread or a concurrency slot that a healthy BMC could use.
"""

from __future__ import annotations

import time
from enum import StrEnum

from provisioner.bmc.base import BmcCircuitOpen, Clock


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitBreaker:
    def __init__(self, name: str, *, threshold: int, reset_s: float, max_reset_s: float,
                 clock: Clock = time.monotonic) -> None:
        self._name = name
        self._threshold = threshold
        self._reset_s = reset_s
        self._max_reset_s = max(max_reset_s, reset_s)
        self._clock = clock
        self._failures = 0
        self._last_error = ""
        self._delay_s = reset_s
        self._open_until: float | None = None
        self._probing = False

    @property
    def state(self) -> BreakerState:
        if self._open_until is None:
            return BreakerState.CLOSED
        if self._probing or self._clock() >= self._open_until:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def check(self) -> None:
        """Raise BmcCircuitOpen if a call now would be refused; changes nothing."""
        if self._open_until is not None and (self._probing or self._clock() < self._open_until):
            self._refuse()

    def before_call(self) -> None:
        """Raise BmcCircuitOpen while open; once the back-off ran out, let one probe pass."""
        if self._open_until is None:
            return
        if self._probing or self._clock() < self._open_until:
            self._refuse()
        self._probing = True

    def _refuse(self) -> None:
        assert self._open_until is not None
        wait_s = max(self._open_until - self._clock(), 0.0)
        probe = "a probe is running" if self._probing else f"next probe in {wait_s:.1f} s"
        raise BmcCircuitOpen(f"BMC {self._name}: circuit open after {self._failures} "
                             f"consecutive failures ({probe}); last: {self._last_error}")

    def record_success(self) -> None:
        self._failures = 0
        self._delay_s = self._reset_s
        self._open_until = None
        self._probing = False

    def record_failure(self, error: BaseException) -> None:
        was_open = self._open_until is not None
        self._probing = False
        self._failures += 1
        self._last_error = str(error)
        if was_open:  # the probe failed: wait longer before the next one
            self._delay_s = min(self._delay_s * 2, self._max_reset_s)
        if was_open or self._failures >= self._threshold:
            self._open_until = self._clock() + self._delay_s

    def release(self) -> None:
        """The call ended without a verdict (cancelled, or a fatal error): free the probe."""
        self._probing = False
