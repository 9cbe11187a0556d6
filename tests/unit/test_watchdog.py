"""The watchdog over blocking calls: real threads blocked on a real Event (a call that never
returns until the test lets it), on a real bounded pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from provisioner.errors import RetryableError
from provisioner.watchdog import CallDeadlineExceeded, PoolExhausted, Watchdog


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # never leave a pool thread blocked behind the test


def blocked(release: threading.Event) -> str:
    release.wait(30)
    return "late"


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_a_call_past_its_deadline_fails_retryably_and_its_thread_is_counted(
        release: threading.Event) -> None:
    with ThreadPoolExecutor(2, thread_name_prefix="kube") as pool:
        watchdog = Watchdog(pool, name="kube", slots=2)
        expired: list[str] = []
        started = time.monotonic()
        with pytest.raises(CallDeadlineExceeded) as caught:
            await watchdog.call(lambda: blocked(release), what="kube request for node n1",
                                deadline_s=0.2, on_expiry=lambda: expired.append("x"))
        took = time.monotonic() - started
        assert 0.2 <= took < 2.0
        assert isinstance(caught.value, RetryableError)
        assert str(caught.value).startswith("kube request for node n1: no result within its "
                                            "0.2 s deadline")
        assert expired == ["x"] and watchdog.hung == 1
        # the other thread still serves calls
        assert await watchdog.call(lambda: "ok", what="next", deadline_s=1) == "ok"
        release.set()  # the hung call returns at last: its thread is free again
        await until(lambda: watchdog.hung == 0)


async def test_all_threads_hung_fails_new_and_queued_calls_fast(
        release: threading.Event) -> None:
    with ThreadPoolExecutor(2, thread_name_prefix="install") as pool:
        watchdog = Watchdog(pool, name="install", slots=2)
        first = asyncio.ensure_future(watchdog.call(lambda: blocked(release), what="run 1",
                                                    deadline_s=0.2))
        second = asyncio.ensure_future(watchdog.call(lambda: blocked(release), what="run 2",
                                                     deadline_s=0.5))
        await asyncio.sleep(0.05)
        # both threads busy: this one queues (its deadline has not started yet) ...
        queued = asyncio.ensure_future(watchdog.call(lambda: "never", what="run 3",
                                                     deadline_s=0.1))
        for task in (first, second):
            with pytest.raises(CallDeadlineExceeded):
                await task
        # ... and fails once every thread is held by a hung call, instead of waiting forever
        with pytest.raises(PoolExhausted, match="all 2 threads of the \"install\" pool"):
            await asyncio.wait_for(queued, 1.0)
        started = time.monotonic()
        with pytest.raises(PoolExhausted, match="run 4: not started"):
            await watchdog.call(lambda: "never", what="run 4", deadline_s=10)
        assert time.monotonic() - started < 0.5
        release.set()
        await until(lambda: watchdog.hung == 0)
        assert await watchdog.call(lambda: "ok", what="run 5", deadline_s=1) == "ok"


async def test_time_queued_for_a_thread_does_not_count_against_the_deadline() -> None:
    with ThreadPoolExecutor(1, thread_name_prefix="install") as pool:
        watchdog = Watchdog(pool, name="install", slots=1)

        def work() -> float:
            time.sleep(0.3)
            return time.monotonic()

        calls = [watchdog.call(work, what=f"run {i}", deadline_s=0.6) for i in range(3)]
        ends = await asyncio.gather(*calls)  # 0.9 s in all, each 0.3 s once started
        assert ends == sorted(ends) and watchdog.hung == 0


async def test_a_failing_call_raises_its_own_error() -> None:
    with ThreadPoolExecutor(1) as pool:
        watchdog = Watchdog(pool, name="kube", slots=1)

        def boom() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await watchdog.call(boom, what="x", deadline_s=1)
        assert watchdog.hung == 0


async def test_hung_threads_are_exported_per_pool(release: threading.Event) -> None:
    from provisioner.metrics import Metrics

    metrics = Metrics()
    with ThreadPoolExecutor(2, thread_name_prefix="kube") as pool:
        watchdog = Watchdog(pool, name="kube", slots=2)
        metrics.watch_pool("kube", lambda: watchdog.hung)
        metrics.watch_pool("install", lambda: 0)
        assert 'provisioner_hung_threads{pool="kube"} 0.0' in metrics.render().decode()
        with pytest.raises(CallDeadlineExceeded):
            await watchdog.call(lambda: blocked(release), what="list nodes", deadline_s=0.1)
        text = metrics.render().decode()
        assert 'provisioner_hung_threads{pool="kube"} 1.0' in text
        assert 'provisioner_hung_threads{pool="install"} 0.0' in text
        release.set()
        await until(lambda: watchdog.hung == 0)
        assert 'provisioner_hung_threads{pool="kube"} 0.0' in metrics.render().decode()
