"""Group commit: callables queued from the event loop run in the store pool, as many as are
waiting at once in one transaction (one pool hop and one commit for a whole burst).

A batch whose transaction fails (a constraint race, a lost connection) is rolled back and
its callables are run again one transaction each, so one bad operation never fails the
others. Each callable sees the writes of those before it in its batch, exactly as if they
had run one after another.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

T = TypeVar("T")
Work = Callable[[Connection, datetime], Any]
_Item = tuple[Work, "asyncio.Future[Any]"]
MAX_BATCH = 256


class TxnBatcher:
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor,
                 clock: Callable[[], datetime], *, max_batch: int = MAX_BATCH,
                 shared: bool = False) -> None:
        """``shared``: the pool runs other calls too (SQLite's one store thread), so the
        batcher behaves as their ``run_in_executor`` does: one batch per turn of the pool
        (what was queued behind it runs before the next batch; by default a drain runs
        batches for as long as callers keep coming), and a call whose caller was cancelled
        before its batch started is not run."""
        self._engine = engine
        self._pool = pool
        self._clock = clock
        self._max_batch = max_batch
        self._shared = shared
        self._queue: deque[_Item] = deque()
        self._lock = threading.Lock()
        self._draining = False

    async def run(self, fn: Callable[[Connection, datetime], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._queue.append((fn, future))
            start = not self._draining
            self._draining = True
        if start:
            loop.run_in_executor(self._pool, self._drain_blocking, loop)
        return await future

    def _drain_blocking(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._lock:
                batch = [self._queue.popleft()
                         for _ in range(min(self._max_batch, len(self._queue)))]
                if not batch:
                    self._draining = False
                    return
            if self._shared:  # read across threads: at worst one more runs, as before
                batch = [item for item in batch if not item[1].cancelled()]
            if batch:
                outcomes = self._batch_blocking(batch)
                try:
                    loop.call_soon_threadsafe(_settle, outcomes)
                except RuntimeError:  # the loop closed while we worked: nobody is waiting
                    return
            if self._shared:
                with self._lock:
                    if not self._queue:
                        self._draining = False
                        return
                try:
                    self._pool.submit(self._drain_blocking, loop)  # behind what waits
                    return
                except RuntimeError:  # the pool shuts down: drain the rest here
                    continue

    def _batch_blocking(self, batch: list[_Item]) -> list[tuple[asyncio.Future[Any], Any,
                                                                BaseException | None]]:
        try:
            with self._engine.begin() as conn:
                now = self._clock()
                results = [fn(conn, now) for fn, _ in batch]
            return [(future, result, None) for (_, future), result in zip(batch, results,
                                                                          strict=True)]
        except Exception as exc:
            if len(batch) == 1:
                return [(batch[0][1], None, exc)]
            return [self._single_blocking(item) for item in batch]

    def _single_blocking(self, item: _Item) -> tuple[asyncio.Future[Any], Any,
                                                     BaseException | None]:
        fn, future = item
        try:
            with self._engine.begin() as conn:
                return future, fn(conn, self._clock()), None
        except Exception as exc:
            return future, None, exc


def _settle(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.done():  # the caller was cancelled meanwhile
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
