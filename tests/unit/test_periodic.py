"""``lifecycle.periodic.every``: the fleet leader's duties go on after a failed round (one
warning naming the duty and the error's first line) and end when cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from provisioner.lifecycle.periodic import every


async def test_a_failed_round_is_one_warning_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []
    enough = asyncio.Event()

    async def duty() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 3:
            enough.set()
        if len(rounds) == 1:
            raise OSError("database away\nsecond line")

    with caplog.at_level(logging.WARNING, logger="provisioner.lifecycle.periodic"):
        task = asyncio.create_task(every(0.001, duty, "expiry sweep"))
        await asyncio.wait_for(enough.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert rounds[:3] == [0, 1, 2]
    assert [r.getMessage() for r in caplog.records] == [
        "expiry sweep failed: OSError: database away"]
