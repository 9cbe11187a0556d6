"""Start-up work that needs the database, waited for while the database is away.

Once the daemon's API answers, a PostgreSQL restart must not make it exit: what start-up
still has to do with the database (resume the in-flight nodes, seed the simulated rack,
settle BMC password rotations a crash left open) is idempotent, so it runs again once
the database is back, or ends with a stop request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TypeVar

from provisioner.errors import StoreUnavailable

log = logging.getLogger("provisioner.daemon")

T = TypeVar("T")

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 15.0


async def while_store_away(what: str, work: Callable[[], Awaitable[T]],
                           stop: asyncio.Event | None = None) -> T | None:
    """``work()``, again after a pause (1 s, doubling up to 15 s) each time it raises
    StoreUnavailable; None once ``stop`` is set. Any other error is the caller's."""
    delay_s = FIRST_DELAY_S
    while True:
        try:
            return await work()
        except StoreUnavailable as exc:
            log.warning("%s: %s; again in %.0f s", what, exc, delay_s)
        if stop is None:
            await asyncio.sleep(delay_s)
        else:
            with suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await stop.wait()
            if stop.is_set():
                return None
        delay_s = min(delay_s * 2, MAX_DELAY_S)
