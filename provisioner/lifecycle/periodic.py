"""One loop for the fleet leader's periodic duties (expiry sweeps, history retention,
scheduled re-acceptance): run the duty every ``interval_s``; a failure (the database away,
a peer down) is one warning line and the loop goes on; cancellation ends it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(interval_s: float, duty: Callable[[], Awaitable[object]], what: str) -> None:
    """Await ``duty()`` every ``interval_s`` until cancelled; ``what`` names it in the
    warning when a round fails."""
    while True:
        try:
            await duty()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the loop's task boundary: the database may be away
            log.warning("%s failed: %s: %s", what, type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
        await asyncio.sleep(interval_s)
