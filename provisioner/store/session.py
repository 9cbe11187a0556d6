"""The one way repositories reach the database: a blocking function run with its own
session in the store's bounded thread pool, so no query ever blocks the event loop.

On PostgreSQL a lost connection (a restart, a fail-over, a cut network) is retried with
jittered back-off (``provisioner.retry``) for up to ``retry_s``: the pool reconnects and the
whole transaction runs again (every write is a compare-and-set, so a retried one that had
committed fails its CAS instead of applying twice). After that: StoreUnavailable."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import Session

from provisioner.errors import StoreUnavailable
from provisioner.retry import Backoff, retry_async, retry_sync
from provisioner.store.batch import TxnBatcher
from provisioner.store.models import utcnow

log = logging.getLogger(__name__)

T = TypeVar("T")

BATCH = 32  # the most calls in one group commit: SQLite's write lock held ~10 ms at most
RETRY_S = 60.0  # how long a call waits for PostgreSQL to come back
BACKOFF = Backoff(0.2, 2.0)  # the pause between tries: 0.2 s doubling to 2 s, jittered


class SessionRepo:
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, *,
                 retry_s: float = RETRY_S) -> None:
        self._engine = engine
        self._pool = pool
        sqlite = engine.dialect.name == "sqlite"
        self._retry_s = 0.0 if sqlite else retry_s
        # the hot paths' calls that wait together share one transaction (TxnBatcher: one
        # pool hop and one commit for the lot). SQLite: one store thread, one writer. On
        # PostgreSQL too since issue 29: each call was a pool hop and three round trips
        # (BEGIN, its statement, COMMIT); a batch holds the row locks of a few of this
        # daemon's own nodes (fenced writes: nodes it leases) for one short transaction,
        # which another daemon's rare write to one of them waits out, and a deadlock or any
        # failed statement only makes the batch run again one call a transaction.
        self._batcher = TxnBatcher(engine, pool, utcnow, max_batch=BATCH, shared=True)

    async def _run(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in the store pool; objects stay usable after the session ends."""

        def once() -> T:
            with Session(self._engine, expire_on_commit=False) as session:
                return fn(session)

        return await self._in_pool(once)

    async def _run_batched(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in the store pool without an ORM session (the per-node hot
        paths, a checkpoint, a transition, one node read, in SQL expressions: their ORM
        overhead was most of a simulated node's CPU, docs/performance.md "Rack"), in a group
        commit with the other such calls waiting for the pool: each sees the writes of those
        before it, and a batch that fails runs again one call a transaction. A lost
        connection is retried as ``_run`` does."""
        batcher = self._batcher
        return await self._retried(lambda: batcher.run(lambda conn, _now: fn(conn)))

    async def _in_pool(self, once: Callable[[], T]) -> T:
        def work() -> T:
            try:  # a store thread sleeps between tries, never the event loop
                return retry_sync(once, backoff=BACKOFF, retryable=_lost,
                                  deadline_s=self._retry_s, on_retry=_noted)
            except DBAPIError as exc:
                if not _lost(exc):
                    raise
                raise self._unavailable(exc) from exc

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    async def _retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` (work already queued to the pool, e.g. a group commit), again while
        the database is away, as ``_run`` does."""
        try:
            return await retry_async(call, backoff=BACKOFF, retryable=_lost,
                                     deadline_s=self._retry_s, on_retry=_noted)
        except DBAPIError as exc:
            if not _lost(exc):
                raise
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: DBAPIError) -> StoreUnavailable:
        """What a caller gets once a lost connection's retries are over."""
        what = "unreachable" if self._retry_s else "error"
        return StoreUnavailable(f"database {what}: {_reason(exc)}")


def _lost(exc: BaseException) -> bool:
    """A lost or refused connection: worth another try once the pool reconnects."""
    return isinstance(exc, DBAPIError) and (exc.connection_invalidated
                                            or isinstance(exc, OperationalError))


def _reason(exc: DBAPIError) -> str:
    return str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__


def _noted(exc: BaseException, retry: int, pause: float) -> None:
    reason = _reason(exc) if isinstance(exc, DBAPIError) else str(exc)
    log.warning("database call failed (%s); retrying in %.1f s", reason, pause)
