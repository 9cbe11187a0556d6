"""How many history rows what a node's agent or OS sends may add: a token bucket per
(node, event). A node's token is in the hands of whatever runs on the node (and, until the
binding holds, of anyone on the provisioning network), so a loop posting callbacks or
reports must not grow the node's history, or the store, without end.

Within budget every call is a row; past the burst, one row per interval that starts at
``1 / rate_per_s`` and doubles while the calls go on, up to ``max_interval_s`` (a node quiet
for an interval starts again with its burst): a loop that never stops adds a few dozen rows a
day, however fast it posts. Past the budget the call still does its work (a callback still
reaches the step that waits for it, a report's facts are still merged); only its row is left
out, counted, and the next row says how many were left out since the one before. The first
call left out after a row is logged as a warning, the others at debug level: the log is
bounded by the same budget as the history.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger(__name__)

ROWS_BURST = 5
ROWS_PER_S = 1 / 12  # five a minute once the burst is spent, fewer as the calls go on
MAX_INTERVAL_S = 3600.0


class RowBudget:
    def __init__(self, *, burst: int = ROWS_BURST, rate_per_s: float = ROWS_PER_S,
                 max_interval_s: float = MAX_INTERVAL_S, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._burst, self._rate, self._max_keys = float(burst), rate_per_s, max_keys
        self._max_interval_s, self._clock = max_interval_s, clock
        # (node, event) -> (tokens, when, rows left out since the last row, interval now)
        self._buckets: OrderedDict[tuple[str, str],
                                   tuple[float, float, int, float]] = OrderedDict()

    def admit(self, node_id: str, event: str) -> int | None:
        """None: no row for this call (it is counted); else how many calls of this
        (node, event) went without a row since the previous row."""
        key, now = (node_id, event), self._clock()
        base = 1 / self._rate
        tokens, then, skipped, interval = self._buckets.pop(key, (self._burst, now, 0, base))
        if now - then >= 2 * interval:  # quiet for a while: the burst again
            tokens, interval = self._burst, base
        tokens = min(self._burst, tokens + (now - then) / interval)
        if tokens < 1.0:
            if skipped == 0:
                log.warning("node %s: %s calls over their history budget (%d, then one per "
                            "%.0f s or fewer): rows left out and counted", node_id, event,
                            int(self._burst), 1 / self._rate)
            else:
                log.debug("node %s: %s left out of the history", node_id, event)
            self._remember(key, (tokens, now, skipped + 1, interval))
            return None
        if skipped:  # over budget since the last row: the next one comes later
            interval = min(self._max_interval_s, 2 * interval)
        self._remember(key, (tokens - 1.0, now, 0, interval))
        return skipped

    def _remember(self, key: tuple[str, str], value: tuple[float, float, int, float]) -> None:
        self._buckets[key] = value
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)


def with_skipped(reason: str, skipped: int) -> str:
    """The row's reason, with the count of calls left out before it."""
    return reason if not skipped else \
        f"{reason} ({skipped} more since the last row, over the history budget)"
