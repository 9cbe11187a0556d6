"""Deadlines for blocking library calls on a bounded, named thread pool.

The kubernetes client and ansible-runner block a thread per call, and either can hang
beyond its own timeouts (a kube exec credential plugin, DNS, an apiserver that trickles
bytes; ansible-runner waiting on a child that ignores its kill, a stuck filesystem). A
``Watchdog`` runs such a call on its pool and gives it a deadline, counted from the moment
a thread picks the call up (time spent queued for a thread does not count: a fifth playbook
run waits for one of the four "install" threads, as designed). On expiry the awaiting
coroutine gets ``CallDeadlineExceeded`` (a ``RetryableError`` naming the call and the
deadline), so the step fails retryably instead of waiting forever, and ``on_expiry`` runs
(ansible's kills the run's processes, which usually frees the thread within seconds).

A Python thread cannot be killed. The abandoned call keeps its pool thread until it
returns on its own; the watchdog counts such threads ("hung"). When every thread of the
pool is held by a hung call, the next call fails at once with ``PoolExhausted`` instead of
queueing behind calls that may never return, and calls already queued are failed the same
way. A hung call that returns later frees its thread and is logged; its result is dropped.
``hung`` is exported for the health of the daemon: a pool that stays exhausted needs an
operator (and the cause, usually a peer that stopped answering, fixed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from provisioner.errors import RetryableError

log = logging.getLogger(__name__)
T = TypeVar("T")


class CallDeadlineExceeded(RetryableError):
    """A blocking call ran past its deadline; its thread was abandoned."""

    def __init__(self, pool: str, what: str, deadline_s: float) -> None:
        super().__init__(f"{what}: no result within its {deadline_s:g} s deadline "
                         f"(\"{pool}\" thread abandoned until the call returns)")
        self.pool, self.what, self.deadline_s = pool, what, deadline_s


class PoolExhausted(RetryableError):
    """Every thread of the pool is held by a call that ran past its deadline."""

    def __init__(self, pool: str, what: str, slots: int) -> None:
        super().__init__(f"{what}: not started: all {slots} threads of the \"{pool}\" pool "
                         "are held by calls that ran past their deadline")
        self.pool, self.what, self.slots = pool, what, slots


class Watchdog:
    """Run blocking calls on ``pool`` (``slots`` threads, named ``name``) with deadlines."""

    def __init__(self, pool: concurrent.futures.Executor, *, name: str, slots: int) -> None:
        self._pool = pool
        self.name = name
        self.slots = slots
        self._lock = threading.Lock()
        self._hung = 0
        self._queued: set[asyncio.Future[None]] = set()

    @property
    def hung(self) -> int:
        """Threads held by calls past their deadline (not yet returned)."""
        with self._lock:
            return self._hung

    async def call(self, fn: Callable[[], T], *, what: str, deadline_s: float,
                   on_expiry: Callable[[], None] | None = None) -> T:
        """``fn()`` on the pool; ``CallDeadlineExceeded`` if it runs longer than
        ``deadline_s`` once started, ``PoolExhausted`` if no thread is left for it."""
        if self.hung >= self.slots:
            raise PoolExhausted(self.name, what, self.slots)
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        started_at: list[float] = []

        def mark_started() -> None:
            if not started.done():
                started.set_result(None)

        def run() -> T:
            started_at.append(time.monotonic())
            loop.call_soon_threadsafe(mark_started)
            return fn()

        future = self._pool.submit(run)
        result = asyncio.wrap_future(future, loop=loop)
        self._queued.add(started)
        try:
            # queued: wait for a thread (or the call's end: it may finish first)
            either: set[asyncio.Future[Any]] = {started, result}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            future.cancel()  # not started yet: it never will be
            raise
        finally:
            self._queued.discard(started)
        if started.done() and started.exception() is not None and future.cancel():
            raise PoolExhausted(self.name, what, self.slots)
        done, _ = await asyncio.wait({result}, timeout=deadline_s)
        if done:
            return result.result()
        self._abandon(future, what, deadline_s, started_at)
        if on_expiry is not None:
            try:
                on_expiry()
            except Exception:  # the deadline's error is the one that matters
                log.exception("%s: cleanup after the deadline failed", what)
        raise CallDeadlineExceeded(self.name, what, deadline_s)

    def _abandon(self, future: concurrent.futures.Future[T], what: str, deadline_s: float,
                 started_at: list[float]) -> None:
        with self._lock:
            self._hung += 1
            hung = self._hung
        log.error("%s: no result within %g s; its \"%s\" thread is abandoned (%d of %d "
                  "threads now held by calls past their deadline)", what, deadline_s,
                  self.name, hung, self.slots)
        if hung >= self.slots:
            self._fail_queued()

        def released(_future: concurrent.futures.Future[T]) -> None:
            with self._lock:
                self._hung -= 1
            took = time.monotonic() - started_at[0] if started_at else float("nan")
            log.warning("%s: returned after %.0f s, past its %g s deadline; its \"%s\" "
                        "thread is free again", what, took, deadline_s, self.name)

        future.add_done_callback(released)

    def _fail_queued(self) -> None:
        for started in list(self._queued):
            if not started.done():
                started.set_exception(PoolExhausted(self.name, "queued call", self.slots))
