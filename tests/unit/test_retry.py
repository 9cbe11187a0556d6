"""``provisioner.retry``: the one retry mechanism (tenacity, exponential back-off, jitter),
on a fake clock."""

from __future__ import annotations

import pytest

from provisioner.errors import Fenced, NodeBusy, RetryableError
from provisioner.retry import RACE, Backoff, raced, retry_async, retry_sync


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pause(seconds)

    def pause(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Flaky:
    """Fails with ``errors`` in turn, then returns ``"done"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"

    async def call(self) -> str:
        return self()


def transient(exc: BaseException) -> bool:
    return isinstance(exc, RetryableError)


def test_backoff_doubles_to_its_ceiling_and_jitter_only_shortens() -> None:
    exact = Backoff(1.0, 5.0, jitter=0.0)
    assert [exact.delay_s(n) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert exact.ceiling_s(10_000) == 5.0  # no overflow however many retries
    low = Backoff(1.0, 5.0, jitter=0.5, rand=lambda: 1.0)
    assert [low.delay_s(n) for n in range(4)] == [0.5, 1.0, 2.0, 2.5]
    drawn = Backoff(0.2, 2.0)  # the default: a random share of each pause
    pauses = {drawn.delay_s(3) for _ in range(200)}
    assert all(0.8 <= p <= 1.6 for p in pauses) and len(pauses) > 100


async def test_retries_what_is_retryable_up_to_its_tries_then_raises_the_last() -> None:
    t = FakeTime()
    flaky = Flaky(RetryableError("a"), RetryableError("b"), RetryableError("c"))
    noted: list[tuple[str, int, float]] = []
    with pytest.raises(RetryableError, match="b"):
        await retry_async(flaky.call, backoff=Backoff(1.0, 30.0, jitter=0.0),
                          retryable=transient, tries=2, sleep=t.sleep, clock=t.clock,
                          on_retry=lambda e, n, p: noted.append((str(e), n, p)))
    assert flaky.calls == 2 and t.sleeps == [1.0] and noted == [("a", 1, 1.0)]
    again = Flaky(RetryableError("a"), RetryableError("b"))
    assert await retry_async(again.call, backoff=Backoff(1.0, 30.0, jitter=0.0),
                             retryable=transient, tries=3, sleep=t.sleep,
                             clock=t.clock) == "done"
    assert t.sleeps == [1.0, 1.0, 2.0]


async def test_an_error_it_does_not_retry_is_raised_at_once() -> None:
    t = FakeTime()
    flaky = Flaky(ValueError("fatal"))
    with pytest.raises(ValueError, match="fatal"):
        await retry_async(flaky.call, backoff=Backoff(1.0, 30.0), retryable=transient,
                          tries=5, sleep=t.sleep, clock=t.clock)
    assert flaky.calls == 1 and t.sleeps == []


async def test_no_pause_runs_past_the_deadline() -> None:
    t = FakeTime()
    flaky = Flaky(*[RetryableError(str(n)) for n in range(10)])
    with pytest.raises(RetryableError, match="2"):
        await retry_async(flaky.call, backoff=Backoff(1.0, 30.0, jitter=0.0),
                          retryable=transient, deadline_s=3.5, sleep=t.sleep, clock=t.clock)
    assert t.sleeps == [1.0, 2.0]  # a third pause (4 s) would end past 3.5 s
    zero = Flaky(RetryableError("now"))
    with pytest.raises(RetryableError, match="now"):  # deadline 0: one try
        await retry_async(zero.call, backoff=Backoff(0.2, 2.0), retryable=transient,
                          deadline_s=0.0, sleep=t.sleep, clock=t.clock)
    assert zero.calls == 1


async def test_an_error_may_name_its_own_pause() -> None:
    class Later(RetryableError):
        retry_after_s = 7.0

    t = FakeTime()
    flaky = Flaky(Later("429"), RetryableError("503"))
    await retry_async(flaky.call, backoff=Backoff(0.5, 30.0, jitter=0.0), retryable=transient,
                      tries=3, sleep=t.sleep, clock=t.clock,
                      hint=lambda e: getattr(e, "retry_after_s", None))
    assert t.sleeps == [7.0, 1.0]


def test_the_blocking_variant_sleeps_on_its_thread() -> None:
    t = FakeTime()
    flaky = Flaky(RetryableError("a"))
    assert retry_sync(flaky, backoff=Backoff(0.2, 2.0, jitter=0.0), retryable=transient,
                      deadline_s=60.0, sleep=t.pause, clock=t.clock) == "done"
    assert t.sleeps == [0.2] and flaky.calls == 2


async def test_a_raced_write_is_retried_a_lost_lease_is_not() -> None:
    assert raced(NodeBusy("moved")) and not raced(Fenced("lease lost"))
    t = FakeTime()
    flaky = Flaky(NodeBusy("moved"), NodeBusy("moved again"))
    assert await retry_async(flaky.call, backoff=RACE, retryable=raced, tries=5,
                             sleep=t.sleep, clock=t.clock) == "done"
    assert len(t.sleeps) == 2 and all(0 < s <= 0.1 for s in t.sleeps)
    fenced = Flaky(Fenced("lease lost"))
    with pytest.raises(Fenced):
        await retry_async(fenced.call, backoff=RACE, retryable=raced, tries=5,
                          sleep=t.sleep, clock=t.clock)
    assert fenced.calls == 1


async def test_a_callable_returning_an_awaitable_is_awaited() -> None:
    """Not only ``async def`` functions: a lambda handing back a future (a batched write)."""
    t = FakeTime()
    flaky = Flaky(RetryableError("a"))
    assert await retry_async(lambda: flaky.call(), backoff=RACE, retryable=transient,
                             tries=2, sleep=t.sleep, clock=t.clock) == "done"
    assert flaky.calls == 2
