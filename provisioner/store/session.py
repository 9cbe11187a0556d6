"""The one way repositories reach the database: a blocking function run with its own
session in the store's bounded thread pool, so no query ever blocks the event loop.

On PostgreSQL a lost connection (a restart, a fail-over, a cut network) is retried with
backoff for up to ``retry_s``: the pool reconnects and the whole transaction runs again
(every write is a compare-and-set, so a retried one that had committed fails its CAS instead
of applying twice). After that: StoreUnavailable."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import Session

from provisioner.errors import StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_S = 60.0  # how long a call waits for PostgreSQL to come back


class SessionRepo:
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, *,
                 retry_s: float = RETRY_S) -> None:
        self._engine = engine
        self._pool = pool
        self._retry_s = 0.0 if engine.dialect.name == "sqlite" else retry_s

    async def _run(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in the store pool; objects stay usable after the session ends."""

        def work() -> T:
            deadline = time.monotonic() + self._retry_s
            delay = 0.2
            while True:
                try:
                    with Session(self._engine, expire_on_commit=False) as session:
                        return fn(session)
                except DBAPIError as exc:
                    delay = self._retry_or_raise(exc, deadline, delay)
                    time.sleep(delay)  # a store thread, never the event loop
                    delay = min(delay * 2, 2.0)

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    async def _retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` (work already queued to the pool, e.g. a group commit), again while
        the database is away, as ``_run`` does."""
        deadline = time.monotonic() + self._retry_s
        delay = 0.2
        while True:
            try:
                return await call()
            except DBAPIError as exc:
                delay = self._retry_or_raise(exc, deadline, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _retry_or_raise(self, exc: DBAPIError, deadline: float, delay: float) -> float:
        """``delay`` when ``exc`` is a lost or refused connection and there is time to try
        again; else ``exc`` raised again, or StoreUnavailable once the time is up."""
        if not (exc.connection_invalidated or isinstance(exc, OperationalError)):
            raise exc
        reason = str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__
        if time.monotonic() + delay > deadline:
            what = "unreachable" if self._retry_s else "error"
            raise StoreUnavailable(f"database {what}: {reason}") from exc
        log.warning("database call failed (%s); retrying in %.1f s", reason, delay)
        return delay
