"""The daemon's one retry mechanism: ``tenacity`` with exponential back-off and jitter.

Every caller that tries a call again (BMC requests, the Kubernetes client, the store's
lost connections, conflicting history writes) states only what differs: which errors are
worth another try, how many tries or how long in all, the first and longest pause, and
what to log. ``Backoff`` doubles the pause from ``first_s`` up to ``max_s`` and draws each
pause at random from its upper ``jitter`` share (``[d·(1-jitter), d]``), so that many
callers who failed together (a BMC or an API server that came back, a database fail-over)
do not all retry in the same instant; a pause is never longer than it was without jitter, so
the deadlines callers promise still hold. ``hint`` lets an error name its own pause (an HTTP
``Retry-After``). ``sleep`` and ``clock`` are injectable: tests run on a fake clock.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

import tenacity

from provisioner.errors import Fenced, NodeBusy

T = TypeVar("T")
Clock = Callable[[], float]
#: what to do before a pause: (the error, the retry number from 1, the pause in seconds)
OnRetry = Callable[[BaseException, int, float], None]
Hint = Callable[[BaseException], float | None]

JITTER: Final = 0.5


@dataclass(frozen=True, slots=True)
class Backoff:
    first_s: float
    max_s: float
    jitter: float = JITTER  # 0: no randomness (tests that count seconds)
    rand: Callable[[], float] = field(default=random.random, compare=False)

    def ceiling_s(self, retry: int) -> float:
        """The longest pause before retry number ``retry`` (0-based)."""
        return float(min(self.first_s * (2 ** min(retry, 64)), self.max_s))

    def delay_s(self, retry: int) -> float:
        """The pause before retry number ``retry`` (0-based), jittered."""
        ceiling = self.ceiling_s(retry)
        return ceiling * (1.0 - self.jitter * self.rand())


def _controls(backoff: Backoff, *, retryable: Callable[[BaseException], bool],
              tries: int | None, deadline_s: float | None, clock: Clock, started: float,
              hint: Hint | None, on_retry: OnRetry | None) -> dict[str, object]:
    """tenacity's ``retry``, ``wait``, ``stop`` and ``before_sleep`` for these rules
    (``started``: when the first attempt began, the deadline's origin)."""

    def failure(state: tenacity.RetryCallState) -> BaseException:
        assert state.outcome is not None
        exc = state.outcome.exception()
        assert exc is not None
        return exc

    def wait(state: tenacity.RetryCallState) -> float:
        named = hint(failure(state)) if hint is not None else None
        return named if named is not None else backoff.delay_s(state.attempt_number - 1)

    def stop(state: tenacity.RetryCallState) -> bool:
        if tries is not None and state.attempt_number >= tries:
            return True
        return deadline_s is not None and clock() + state.upcoming_sleep - started > deadline_s

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None:
            on_retry(failure(state), state.attempt_number, state.upcoming_sleep)

    return {"retry": tenacity.retry_if_exception(retryable), "wait": wait, "stop": stop,
            "before_sleep": before_sleep, "reraise": True}


async def retry_async(attempt: Callable[[], Awaitable[T]], *, backoff: Backoff,
                      retryable: Callable[[BaseException], bool], tries: int | None = None,
                      deadline_s: float | None = None,
                      sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                      clock: Clock = time.monotonic, hint: Hint | None = None,
                      on_retry: OnRetry | None = None) -> T:
    """``await attempt()`` until it returns, an error ``retryable`` refuses is raised, or
    ``tries`` attempts (None: no limit) or ``deadline_s`` (no pause runs past it) are spent:
    then the last error is raised as it was.

    The first attempt runs before any of tenacity's machinery is built (most calls succeed
    at once, and a store or BMC call paid for that machinery on every call); tenacity then
    takes over from the first failure exactly as if it had made that attempt."""
    started = clock()
    try:
        return await attempt()
    except Exception as exc:
        if not retryable(exc):
            raise
        first: list[BaseException] = [exc]
    controls = _controls(backoff, retryable=retryable, tries=tries, deadline_s=deadline_s,
                         clock=clock, started=started, hint=hint, on_retry=on_retry)
    retrying = tenacity.AsyncRetrying(sleep=sleep, **controls)  # type: ignore[arg-type]

    async def once() -> T:  # tenacity awaits only what a coroutine function returns
        if first:
            raise first.pop()  # the attempt already made: tenacity counts it as its first
        return await attempt()

    return await retrying(once)


def retry_sync(attempt: Callable[[], T], *, backoff: Backoff,
               retryable: Callable[[BaseException], bool], tries: int | None = None,
               deadline_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
               clock: Clock = time.monotonic, hint: Hint | None = None,
               on_retry: OnRetry | None = None) -> T:
    """``retry_async`` for a blocking call, on a worker thread (never the event loop)."""
    started = clock()
    try:
        return attempt()
    except Exception as exc:
        if not retryable(exc):
            raise
        first: list[BaseException] = [exc]
    controls = _controls(backoff, retryable=retryable, tries=tries, deadline_s=deadline_s,
                         clock=clock, started=started, hint=hint, on_retry=on_retry)
    retrying = tenacity.Retrying(sleep=sleep, **controls)  # type: ignore[arg-type]

    def once() -> T:
        if first:
            raise first.pop()  # the attempt already made: tenacity counts it as its first
        return attempt()

    return retrying(once)


#: a write that another writer raced (``NodeBusy``): read again and write again, soon
RACE: Final = Backoff(0.05, 0.4)


def raced(exc: BaseException) -> bool:
    """Another writer moved the node between our read and our write; not a lost lease
    (``Fenced``: the node is another daemon's now, a retry would be refused too)."""
    return isinstance(exc, NodeBusy) and not isinstance(exc, Fenced)
